"""Does a shadow delay live calls? Live latency at concurrency 1 with and without a candidate in
shadow, side by side in one run (issue 21).

`reef serve` on the embedded SmolLM2-135M. One client sends live chat calls one at a time, with
a pause between them as a user or an agent's tools leave (`--think`), and measures each call's
latency. Blocks alternate in one run, so that a machine that slows down meanwhile slows both
sides alike: without a shadow (the baseline), then with a held candidate in shadow (it answers a
copy of every live call on idle capacity: llama.cpp's background jobs; rejected at the end of
its block), `--rounds` times. The target: the shadow blocks' p50 within 10% of the baseline
blocks'. It also counts what became of the copies (answered, preempted, dropped).

    .venv/bin/python -m bench.speed.shadow [--rounds 3] [--calls 15] [--think 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.common.results import OUT
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef

QUESTIONS = [
    "Name a colour.",
    "What is the capital of France?",
    "Name an animal that lives in the sea.",
    "What is 3+4?",
    "Name a fruit.",
    "What do bees make?",
]
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15, help="live calls per block")
    parser.add_argument("--think", type=float, default=0.5, help="seconds between live calls")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="reef-bench-shadow-"))
    (project / "reef.yaml").write_text(
        "engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n"
        "gate:\n  policy: review\n  shadow: {scorer: {type: regex, pattern: '\\\\w'}}\n"
    )
    (project / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Hi"}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    (project / "evals" / "default.jsonl").write_text(json.dumps(task) + "\n")
    before: list[float] = []
    shadowed: list[float] = []
    totals = {"answered": 0, "preempted": 0, "dropped": 0, "skipped": 0}
    with reef_serve(project, free_port()).start() as server:
        warm(server, args)
        for round_ in range(args.rounds):
            before += block(server, args)
            harness = project / f"candidate-{round_}"
            harness.mkdir()
            (harness / "AGENTS.md").write_text(f"Answer in one short sentence. ({round_})\n")
            candidate = shadow(project, server, harness)
            calls = block(server, args)
            shadowed += calls
            copies = settle(server, candidate, expected=len(calls))
            run_reef(project, "release", "reject", candidate, "--reason", "bench over")
            while candidate in httpx.get(server.url + "/reef/status").json()["shadows"]:
                time.sleep(0.2)  # the next baseline block runs with no shadow at all
            for name in totals:
                totals[name] += copies[name]
    report(before, shadowed, totals, args)


def warm(server: ServerProcess, args: argparse.Namespace) -> None:
    for question in QUESTIONS:
        ask(server, question, args.max_tokens)


def ask(server: ServerProcess, question: str, max_tokens: int) -> float:
    started = time.perf_counter()
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=120,
    )
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


def block(server: ServerProcess, args: argparse.Namespace) -> list[float]:
    latencies = []
    for n in range(args.calls):
        latencies.append(ask(server, QUESTIONS[n % len(QUESTIONS)], args.max_tokens))
        time.sleep(args.think)
    return latencies


def shadow(project: Path, server: ServerProcess, folder: Path) -> str:
    run_reef(project, "release", "publish", str(folder), "--kind", "harness")
    shown = json.loads(run_reef(project, "release", "candidates", "--json").stdout)
    candidate = next(c["id"] for c in shown if c["state"] == "held")
    run_reef(project, "release", "shadow", candidate)
    while candidate not in httpx.get(server.url + "/reef/status").json()["shadows"]:
        time.sleep(0.2)
    return candidate


def settle(server: ServerProcess, candidate: str, expected: int, timeout_s: float = 60) -> dict:
    """What became of the copies once the shadow caught up (or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        copies = httpx.get(server.url + "/reef/status").json()["shadows"][candidate]
        done = copies["answered"] + copies["dropped"] + copies["skipped"]
        if done >= expected or time.monotonic() > deadline:
            return copies
        time.sleep(0.5)


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(
    before: list[float], shadowed: list[float], copies: dict, args: argparse.Namespace
) -> None:
    baseline = statistics.median(before)
    table = Table(
        title=f"live latency at concurrency 1 ({args.rounds} rounds of {args.calls} calls a "
        f"side, {args.think} s between, max_tokens {args.max_tokens})"
    )
    for column in ("block", "p50 ms", "p95 ms", "p50 vs baseline"):
        table.add_column(column, justify="right")
    for name, values in (("no shadow (baseline)", before), ("a candidate in shadow", shadowed)):
        table.add_row(
            name,
            f"{statistics.median(values):.0f}",
            f"{p(values, 0.95):.0f}",
            f"{statistics.median(values) / baseline:.2f}x",
        )
    console.print(table)
    console.print(
        f"shadow copies: answered {copies['answered']}, preempted {copies['preempted']} times, "
        f"dropped {copies['dropped']}, skipped {copies['skipped']} (of {len(shadowed)} live calls)"
    )
    ratio = statistics.median(shadowed) / baseline
    console.print(
        f"target: p50 with a shadow within 10% of without -> {ratio:.2f}x: "
        f"{'PASS' if ratio <= 1.10 else 'MISS'}"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "shadow.json").write_text(
        json.dumps({"baseline": before, "shadow": shadowed, "copies": copies})
    )


if __name__ == "__main__":
    main()
