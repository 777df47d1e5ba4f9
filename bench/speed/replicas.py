"""How long a release takes to serve on every replica, told through PostgreSQL against polling
the remote, in one run (issue 20).

N replicas (`reef serve --engine upstream` in front of a fast fake upstream, each with its own
project folder, as on its own machine) share one release remote (a `file://` bare repository
with Git LFS) and one store. A harness release is published with `reef release publish` from
another folder, and the time from its publication (the release's `created_at`, on this machine's
clock, taken before it is pushed) to the moment every replica's `/reef/status` serves it is
measured, several times. Two settings, same machine, same run:

- PostgreSQL (a throwaway server, `reef.testing.postgres`): the publish NOTIFYs the replicas,
  which fetch at once (the remote is still polled, ten times slower, as a safety net);
- the baseline, a shared SQLite file, which cannot notify: replicas poll the remote every
  `releases.poll_s` (1 s, the default).

    .venv/bin/python -m bench.speed.replicas [--replicas 3] [--releases 5]

Target (the issue's): every replica serves a new release within 2 s. Figures also go to
bench/out/replicas.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.common.proxy.servers import fake_upstream
from bench.common.results import OUT
from reef.releases.chain import ReleaseChain
from reef.testing.postgres import PostgresServer, postgres_available
from reef.testing.processes import (
    ServerProcess,
    free_port,
    reef_serve,
    run_reef,
    serving_everywhere,
)

OUT_FILE = OUT / "replicas.json"
TOKEN = "bench-replicas-token"
TARGET_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--releases", type=int, default=5)
    args = parser.parse_args()
    if reason := postgres_available():
        sys.exit(f"no PostgreSQL to measure: {reason}")
    rows = []
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reef-replicas-")))
        upstream = stack.enter_context(fake_upstream(folder).start())
        database = stack.enter_context(PostgresServer())
        for name, store in (
            ("PostgreSQL (NOTIFY)", database.create_database("bench")),
            ("SQLite (poll 1 s)", str(folder / "shared.db")),
        ):
            rows.append(measure(folder / name.split()[0], name, store, upstream, args))
    for row in rows:
        print(
            f"{row['setting']:<22} replicas {row['replicas']}: median {row['median_s']:.2f} s, "
            f"max {row['max_s']:.2f} s over {len(row['seconds'])} releases"
        )
    notify, poll = rows
    print(f"NOTIFY vs polling: {poll['median_s'] / notify['median_s']:.1f}x faster (median)")
    met = "met" if notify["max_s"] < TARGET_S else "NOT met"
    print(f"target, every replica within {TARGET_S} s of the publish: {met}")
    OUT.mkdir(exist_ok=True)
    OUT_FILE.write_text(json.dumps(rows, indent=2))


def measure(
    folder: Path, name: str, store: str, upstream: ServerProcess, args: argparse.Namespace
) -> dict:
    folder.mkdir()
    bare = folder / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True)
    env = {"REEF_TOKEN": TOKEN, "REEF_STORE_URL": store, "REEF_RELEASES_REMOTE": f"file://{bare}"}
    proxy = ("--engine", "upstream", "--upstream-url", f"{upstream.url}/v1")
    seconds = []
    with ExitStack() as stack:
        replicas = []
        for number in range(args.replicas):
            project = folder / f"replica-{number}"
            project.mkdir()
            (project / "reef.yaml").write_text("gate:\n  policy: always\n")
            replicas.append(
                stack.enter_context(reef_serve(project, free_port(), *proxy, env=env).start())
            )
        publisher = folder / "publisher"
        publisher.mkdir()
        (publisher / "reef.yaml").write_text("gate:\n  policy: always\n")
        for number in range(1, args.releases + 1):
            harness = publisher / f"harness-{number}"
            harness.mkdir()
            (harness / "AGENTS.md").write_text(f"Release {number}: answer briefly.\n")
            published = run_reef(
                publisher, "release", "publish", str(harness), "--kind", "harness", "--approve",
                env={**os.environ, **env},
            )  # fmt: skip
            if published.returncode != 0:
                sys.exit(published.stdout + published.stderr)
            release = ReleaseChain(publisher / ".reef/releases.git").get(f"default@{number}")
            seconds.append(until_all_serve(replicas, release.release_id, release.created_at))
            print(f"  {name}: default@{number} on all {args.replicas} in {seconds[-1]:.2f} s")
    return {
        "setting": name,
        "replicas": args.replicas,
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(statistics.median(seconds), 3),
        "max_s": round(max(seconds), 3),
    }


def until_all_serve(replicas: list[ServerProcess], release_id: str, published_at: float) -> float:
    """Seconds from `published_at` (time.time()) until every replica serves `release_id`."""
    if not serving_everywhere(replicas, release_id, TOKEN):
        sys.exit(f"{release_id} did not serve on every replica within 60 s")
    return time.time() - published_at


if __name__ == "__main__":
    main()
