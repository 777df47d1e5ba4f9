"""What metrics and tracing cost the serving path (issue 40): Reef as a proxy in front of
`bench.speed.proxy`'s fast fake upstream, three ways in one run, interleaved round by round:

- **before metrics**: Reef at the commit before `/metrics` existed (its `src/` from `git
  archive`, run on this venv), the baseline;
- **metrics**: this checkout, tracing off (metrics are always on);
- **metrics + tracing**: this checkout exporting every span over OTLP/HTTP to a receiver this
  bench serves on loopback (which decodes nothing, as a collector's intake would not slow Reef);
- **tracing, 10% sampled**: the same with OpenTelemetry's own sampler variables
  (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`).

One aiohttp client sends the same short chat request at concurrency 1 (p50 latency) and 4
(requests/s); each answer is the same 6 tokens, so tokens/s is 6 x requests/s.

    .venv/bin/python -m bench.speed.observability [--rounds 3] [--c1 600] [--c4 1200] [--base
        7d72f49]

Targets: at most 2% of requests/s lost at c=1 and c=4, at most 0.1 ms of p50 with tracing off
and 0.3 ms with it on. Figures go to bench/out/observability.json.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import tarfile
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.common.proxy.load import Block, Target, run_block
from bench.common.proxy.servers import BODY, SCENARIO, fake_upstream, new_key, pid_of, started
from bench.common.results import OUT
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import served_in_thread

REPO = Path(__file__).resolve().parents[2]
BEFORE, METRICS, TRACING = "before metrics", "metrics", "metrics + tracing"
SAMPLED = "tracing, 10% sampled"
TOKENS_PER_ANSWER = 6  # the fake upstream's completion_tokens
console = Console(width=120)


def source_at(commit: str, folder: Path) -> Path:
    """`src/` of `commit`, unpacked into `folder` (for PYTHONPATH)."""
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def reef(folder: Path, upstream: str, token: str, env: dict[str, str]) -> ServerProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reef.yaml").write_text("engine:\n  kind: upstream\n")
    args = ("--engine", "upstream", "--upstream-url", f"{upstream}/v1")
    return reef_serve(folder, free_port(), *args, env={"REEF_TOKEN": token, **env})


async def swallow(request: Request) -> Response:
    await request.body()
    return Response(b"", media_type="application/x-protobuf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--c1", type=int, default=600, help="requests per round at c=1")
    parser.add_argument("--c4", type=int, default=1200, help="requests per round at c=4")
    parser.add_argument("--base", default="7d72f49", help="the commit before metrics")
    args = parser.parse_args()
    token = new_key()
    headers = {
        "authorization": f"Bearer {token}",
        "content-type": "application/json",
        "x-reef-scenario": SCENARIO,
    }
    blocks: dict[tuple[str, int], list[Block]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="reef-bench-observability-") as scratch,
        ExitStack() as stack,
    ):
        root = Path(scratch)
        (root / "upstream").mkdir()
        upstream = fake_upstream(root / "upstream")
        stack.callback(upstream.stop)
        started(upstream)
        collector = stack.enter_context(
            served_in_thread(Starlette(routes=[Route("/v1/traces", swallow, methods=["POST"])]))
        )
        base_src = source_at(args.base, root / "base")
        environments = {
            BEFORE: {"PYTHONPATH": str(base_src / "src")},
            METRICS: {},
            TRACING: {"OTEL_EXPORTER_OTLP_ENDPOINT": collector},
            SAMPLED: {
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.1",
            },
        }
        servers = {
            name: reef(root / name.replace(" ", "-"), upstream.url, token, env)
            for name, env in environments.items()
        }
        targets = []
        for name, server in servers.items():
            stack.callback(server.stop)
            started(server)
            targets.append(Target(name, f"{server.url}/v1/chat/completions", headers, True))
        pids = tuple(pid_of(server) for server in servers.values())
        for target in targets:  # warm: connections, caches, the first records
            run_block(target, BODY, 4, 200, 60, ())
        for number in range(1, args.rounds + 1):
            console.print(f" round {number} of {args.rounds}")
            for concurrency, count in ((1, args.c1), (4, args.c4)):
                for target in targets if number % 2 else list(reversed(targets)):
                    block = run_block(target, BODY, concurrency, count, 120, pids)
                    if block.failures:
                        raise SystemExit(f"{target.name} failed: {block.failures[0]}")
                    blocks.setdefault((target.name, concurrency), []).append(block)
    show(blocks, args)


def show(blocks: dict[tuple[str, int], list[Block]], args: argparse.Namespace) -> None:
    def p50(name: str, concurrency: int) -> float:
        return statistics.median(ms for b in blocks[name, concurrency] for ms in b.latencies_ms)

    def rate(name: str, concurrency: int) -> float:
        return statistics.median(b.requests_per_s for b in blocks[name, concurrency])

    table = Table(title=f"The serving path with metrics and tracing ({args.rounds} rounds)")
    for column in ("Reef", "p50 c=1 (ms)", "vs before", "req/s c=1", "vs before",
                   "req/s c=4", "tokens/s c=4", "vs before"):  # fmt: skip
        table.add_column(column)
    figures = {}
    for name in (BEFORE, METRICS, TRACING, SAMPLED):
        row = {
            "p50_c1_ms": round(p50(name, 1), 3),
            "p50_c1_added_ms": round(p50(name, 1) - p50(BEFORE, 1), 3),
            "rps_c1": round(rate(name, 1), 1),
            "rps_c1_ratio": round(rate(name, 1) / rate(BEFORE, 1), 4),
            "rps_c4": round(rate(name, 4), 1),
            "tokens_per_s_c4": round(rate(name, 4) * TOKENS_PER_ANSWER, 1),
            "rps_c4_ratio": round(rate(name, 4) / rate(BEFORE, 4), 4),
        }
        figures[name] = row
        table.add_row(
            name,
            f"{row['p50_c1_ms']:.3f}",
            f"{row['p50_c1_added_ms']:+.3f} ms",
            f"{row['rps_c1']:.0f}",
            f"{row['rps_c1_ratio']:.3f}x",
            f"{row['rps_c4']:.0f}",
            f"{row['tokens_per_s_c4']:.0f}",
            f"{row['rps_c4_ratio']:.3f}x",
        )
    console.print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / "observability.json").write_text(json.dumps({"base": args.base, **figures}, indent=2))


if __name__ == "__main__":
    main()
