"""Records per second into PostgreSQL against SQLite, through Reef's proxy path, in one run
(issue 20).

A fast fake upstream (`bench/common/proxy/fake_upstream.py`) stands in for the model, so what is
measured is Reef recording: two `reef serve --engine upstream` in front of it, one with its
default SQLite store, one with `REEF_STORE_URL` on a throwaway PostgreSQL server on loopback
(fsync and `synchronous_commit` on, as in production; `reef.testing.postgres`). One aiohttp
client sends the same short chat request to each, at concurrency 32 for records/s and at 1 for
latency, in interleaved rounds. Every 200 must carry a receipt, and every receipt must be in its
store afterwards. The baseline is SQLite, measured in the same run.

    .venv/bin/python -m bench.speed.store_backends [--rounds 3] [--c32 3000] [--c1 300]

Figures also go to bench/out/store_backends.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.common.proxy.load import Block, Target, run_block
from bench.common.proxy.servers import BODY, SCENARIO, fake_upstream, new_key, pid_of, started
from bench.common.results import OUT
from reef.store import ExperienceStore
from reef.testing.postgres import PostgresServer, postgres_available
from reef.testing.processes import free_port, reef_serve

OUT_FILE = OUT / "store_backends.json"
SQLITE, POSTGRES = "SQLite (default)", "PostgreSQL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--c32", type=int, default=3000, help="requests per round at c=32")
    parser.add_argument("--c1", type=int, default=300, help="requests per round at c=1")
    args = parser.parse_args()
    if reason := postgres_available():
        sys.exit(f"no PostgreSQL to measure: {reason}")
    key = new_key()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reef-stores-")))
        upstream = stack.enter_context(fake_upstream(folder).start())
        database = stack.enter_context(PostgresServer())
        url = database.create_database("bench")
        stores: dict[str, str | Path] = {SQLITE: folder / "sqlite/.reef/experience.db"}
        stores[POSTGRES] = url
        targets = []
        for name in stores:
            project = folder / name.split()[0].lower()
            project.mkdir()
            env = {"REEF_TOKEN": key, **({"REEF_STORE_URL": url} if name == POSTGRES else {})}
            proxy = ("--engine", "upstream", "--upstream-url", f"{upstream.url}/v1")
            server = reef_serve(project, free_port(), *proxy, env=env)
            started(server)
            stack.enter_context(server)
            target_headers = {**headers, "x-reef-scenario": SCENARIO}
            chat = f"{server.url}/v1/chat/completions"
            warm = Target(name, chat, {**headers, "x-reef-scenario": "warmup"})
            run_block(warm, BODY, 32, 300, 60, ())
            targets.append(Target(name, chat, target_headers, True, (pid_of(server),)))
        rows = summarise(measure(targets, {32: args.c32, 1: args.c1}, args.rounds))
        for row in rows:  # every answer is in: each receipt's record is committed
            row["stored"] = stored(stores[row["setting"]])
    print_table(rows)
    OUT.mkdir(exist_ok=True)
    OUT_FILE.write_text(json.dumps({"rows": rows}, indent=2))


def measure(
    targets: list[Target], counts: dict[int, int], rounds: int
) -> dict[tuple[str, int], list[Block]]:
    """Each target at each concurrency, interleaved, the order reversed every other round."""
    blocks: dict[tuple[str, int], list[Block]] = {}
    for number in range(rounds):
        for concurrency, count in counts.items():
            for target in targets if number % 2 == 0 else list(reversed(targets)):
                block = run_block(target, BODY, concurrency, count, 120, target.pids)
                if block.failures:
                    print(f"  {target.name}: {len(block.failures)} failed: {block.failures[0]}")
                blocks.setdefault((target.name, concurrency), []).append(block)
                print(
                    f"  round {number + 1}, {target.name}, c={concurrency}: "
                    f"{block.requests_per_s:.0f} req/s, p50 {block.p50_ms:.2f} ms",
                    flush=True,
                )
    return blocks


def summarise(blocks: dict[tuple[str, int], list[Block]]) -> list[dict]:
    rows = []
    for (name, concurrency), found in blocks.items():
        latencies = sorted(ms for block in found for ms in block.latencies_ms)
        rows.append(
            {
                "setting": name,
                "c": concurrency,
                "records_per_s": round(statistics.median(b.requests_per_s for b in found), 1),
                "p50_ms": round(latencies[len(latencies) // 2], 3),
                "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 3),
                "receipts": sum(len(b.receipts) for b in found),
                "failed": sum(len(b.failures) for b in found),
            }
        )
    baseline = {row["c"]: row["records_per_s"] for row in rows if row["setting"] == SQLITE}
    for row in rows:
        row["vs_sqlite"] = round(row["records_per_s"] / baseline[row["c"]], 2)
    return rows


def stored(location: str | Path) -> int:
    """Records of the bench's scenario in a store (its server stopped or not)."""
    with ExperienceStore(location) as store:
        return int(store.stats()["scenarios"].get(SCENARIO, {}).get("records", 0))


def print_table(rows: list[dict]) -> None:
    print(f"{'store':<18} {'c':>3} {'records/s':>10} {'x SQLite':>9} {'p50 ms':>8} {'p95 ms':>8}")
    for row in rows:
        print(
            f"{row['setting']:<18} {row['c']:>3} {row['records_per_s']:>10.1f} "
            f"{row['vs_sqlite']:>9.2f} {row['p50_ms']:>8.2f} {row['p95_ms']:>8.2f}"
        )
    for name in (SQLITE, POSTGRES):
        receipts = sum(row["receipts"] for row in rows if row["setting"] == name)
        stored_now = next(row["stored"] for row in rows if row["setting"] == name)
        print(f"{name}: {receipts} receipts handed out, {stored_now} records stored")


if __name__ == "__main__":
    main()
