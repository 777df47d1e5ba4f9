"""Serving benchmark: Reef against the servers it stands in for, measured in one run.

    .venv/bin/pip install -e '.[bench]' && .venv/bin/python -m bench.speed.serving

`--quick` is a smoke run with small counts; `--part engine|upstream` runs one part; `--help`
lists the rest. The figures are printed as tables and written to bench/out/serving.json.

Part `engine`: llama.cpp throughput on the embedded SmolLM2-135M GGUF. Baseline A is the stock
llama-cpp-python server; Reef runs with recording on and off (the `x-reef-capture: false`
header), so on/off is the cost of recording; baseline B is the stock server with `logits_all`
and `logprobs` requested, the stock way to get every token's logprob that Reef always captures.

Part `upstream`: the latency Reef adds as a recording proxy in front of an OpenAI-compatible
server (the loopback peer in `reef.testing.openai_peer`): with its defaults (the store fsyncs
every commit, `store.synchronous: full`; `server.log_level: info`), with `synchronous: normal`
(the cost of the fsync), and with `log_level: warning` (the cost of logging every call).

All servers of a part run side by side on 127.0.0.1 (an idle one uses no CPU) and are measured in
interleaved rounds, so a slow spell of the machine hits every setting alike; throughput is the
median of the rounds. Before each block of requests the script waits for other processes to
leave the CPUs alone, and measures a block again when they did not. Every load is bounded in
requests and in seconds.

The benchmark reads top to bottom in these modules of `bench/speed/serving/`, beside this one:

- `config.py`: the requests, the settings' names, the targets, the options;
- `servers.py`: the servers compared (the stock llama.cpp server, the peer, Reef);
- `load.py`: the load generator (timed bursts of requests, interleaved rounds);
- `cpu.py`: how busy the rest of the machine was while a burst ran;
- `stats.py`: samples, blocks and measurements, medians and percentiles;
- `engine.py` and `upstream.py`: the two parts, with their checks;
- `report.py`: the tables, the targets, the machine, the JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common.serving.config import (
    BASELINE_A,
    DEFAULT_OUT,
    N_CTX,
    N_THREADS,
    PEER_DIRECT,
    PROMPT,
    SEED,
    Options,
    console,
)
from bench.speed.serving.engine import run_engine_part
from bench.speed.serving.report import (
    Target,
    engine_table,
    engine_targets,
    machine,
    noise_notes,
    upstream_table,
    upstream_targets,
    write_json,
)
from bench.speed.serving.upstream import run_upstream_part


def count_pair(text: str) -> tuple[int, int]:
    """`8,12` -> (8, 12): a request count for the low and the high concurrency."""
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two counts like 8,12, got {text!r}") from None
    if low < 1 or high < 1:
        raise argparse.ArgumentTypeError("request counts must be at least 1")
    return low, high


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.speed.serving",
        description="Benchmark Reef's serving against stock servers, in one run.",
    )
    parser.add_argument("--part", choices=["engine", "upstream", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument(
        "--requests",
        type=count_pair,
        help="engine part: requests per setting at concurrency 1 and 4, over all rounds "
        "(default 9,18; quick 2,8)",
    )
    parser.add_argument(
        "--upstream-requests",
        type=count_pair,
        help="upstream part: requests per setting at concurrency 1 and 32, over all rounds "
        "(default 300,1000; quick 40,100)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds; each request count is split evenly over them (default 3)",
    )
    parser.add_argument(
        "--max-tokens", type=int, help="completion tokens per engine request (default 64)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=120.0,
        help="seconds one block of requests may run before it stops sending (default 120)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="seconds to wait, before each block, for other processes to leave the CPUs "
        "alone (default 120; 0 to measure at once)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    return Options(
        part=args.part,
        rounds=max(1, args.rounds or (2 if args.quick else 3)),
        engine_requests=args.requests or ((2, 8) if args.quick else (9, 18)),
        upstream_requests=args.upstream_requests or ((40, 100) if args.quick else (300, 1000)),
        engine_warmup=1 if args.quick else 2,
        upstream_warmup=10 if args.quick else 50,
        max_tokens=args.max_tokens or (16 if args.quick else 64),
        time_limit_s=args.time_limit,
        quiet_wait_s=args.quiet_wait,
        out=args.out,
    )


@dataclass
class Results:
    """What the parts measured, as the report shows it."""

    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    report = header(options, argv)
    started = time.perf_counter()
    results = Results()
    if options.part in ("engine", "all"):
        report["engine"] = engine_results(options, results)
    if options.part in ("upstream", "all"):
        report["upstream"] = upstream_results(options, results)
    report["targets"] = [t.to_json() for t in results.targets]
    report["notes"] = results.notes
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    print_results(results)
    write_json(options.out, report)
    console.print(f"{report['elapsed_s']} s in all; figures in {options.out}", highlight=False)
    return 0


def header(options: Options, argv: list[str] | None) -> dict[str, Any]:
    """Print the machine and the settings; the start of the JSON report."""
    host = machine()
    console.print(
        f"Machine: {host['cpus']} CPUs, {host['cpu_model']}; Python {host['python']}, "
        f"llama-cpp-python {host['llama_cpp_python']}, reef {host['reef']} ({host['git_commit']})",
        highlight=False,
    )
    (e1, e4), (u1, u32) = options.engine_requests, options.upstream_requests
    console.print(
        f"Settings: {options.rounds} rounds; engine: {e1} requests at c=1, {e4} at c=4, "
        f"max_tokens {options.max_tokens}; upstream: {u1} requests at c=1, {u32} at c=32",
        highlight=False,
    )
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": [
            "python",
            "-m",
            "bench.speed.serving",
            *(sys.argv[1:] if argv is None else argv),
        ],
        "machine": host,
        "options": {
            "part": options.part,
            "rounds": options.rounds,
            "engine_requests": options.engine_requests,
            "upstream_requests": options.upstream_requests,
            "max_tokens": options.max_tokens,
            "prompt": PROMPT,
            "seed": SEED,
            "n_ctx": N_CTX,
            "n_threads": N_THREADS,
        },
    }


def engine_results(options: Options, results: Results) -> dict[str, Any]:
    engine = run_engine_part(options)
    results.tables.append(engine_table(engine.measurements, options))
    results.targets += engine_targets(engine.measurements)
    results.notes += engine.checks + noise_notes(engine.measurements)
    return {
        "baseline": BASELINE_A,
        "rows": [m.to_json() for m in engine.measurements],
        "checks": engine.checks,
    }


def upstream_results(options: Options, results: Results) -> dict[str, Any]:
    upstream = run_upstream_part(options)
    results.tables.append(upstream_table(upstream, options))
    results.targets += upstream_targets(upstream)
    results.notes += noise_notes(upstream)
    return {"baseline": PEER_DIRECT, "rows": [m.to_json() for m in upstream]}


def print_results(results: Results) -> None:
    console.rule("[bold]Results")
    for table in results.tables:
        console.print(table)
    for note in results.notes:
        console.print(note, highlight=False)
    for target in results.targets:
        console.print(target.line(), highlight=False)


if __name__ == "__main__":
    sys.exit(main())
