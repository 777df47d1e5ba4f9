"""Reef as a recording proxy in front of a remote model, against calling the model directly and
against the LiteLLM proxy, in one run (issue 11, goal 4).

A fast fake upstream (`fake_upstream.py`, beside this file) stands in for the remote model. Reef
serves in front of it with its defaults (every call recorded and fsync'd before it is answered),
LiteLLM in front of it with a master key and no database, and a bare Python forwarder
(`bare_forwarder.py`: bytes in, bytes out, no record) beside them, whose added latency is
the floor of any Python hop here. One aiohttp client sends the same short chat request to each:
at concurrency 1 for latency, at 32 for requests/s, in interleaved rounds.

    .venv/bin/python -m bench.speed.proxy            # about 6 minutes on a quiet machine
                                               # (and 2 more the first time: LiteLLM)
    .venv/bin/python -m bench.speed.proxy --help

Targets: Reef adds at most 1 ms at p50, concurrency 1, over the direct call; Reef's requests/s
at concurrency 32 are at least 10x LiteLLM's. Figures also go to bench/out/proxy.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.proxy.load import Block, Target, run_block
from bench.common.proxy.servers import (
    BODY,
    LITELLM_VENV,
    SCENARIO,
    bare_forwarder,
    commit_probe_ms,
    complete_records,
    ensure_litellm,
    fake_upstream,
    litellm_proxy,
    litellm_version,
    new_key,
    pid_of,
    reef_proxy,
    rss_mib,
    started,
    stored_receipts,
)
from bench.common.results import OUT
from bench.common.serving.config import console
from bench.common.serving.cpu import NOISY_CORES, wait_for_quiet

DIRECT, REEF, LITELLM = "direct (no proxy)", "Reef", "LiteLLM"
BARE = "bare Python forwarder"
ADDED_P50_TARGET_MS = 1.0
THROUGHPUT_TARGET = 10.0
OUT_FILE = OUT / "proxy.json"


@dataclass(frozen=True)
class Options:
    rounds: int
    requests: dict[int, int]  # concurrency -> requests per round, direct and Reef
    litellm_requests: dict[int, int]  # concurrency -> requests per round, LiteLLM
    litellm: bool
    compare: Path | None  # another version's source folder, measured as a setting of its own
    quiet_wait_s: float
    time_limit_s: float


@dataclass
class Series:
    """One server at one concurrency, over the rounds."""

    name: str
    concurrency: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def latencies(self) -> list[float]:
        return [ms for block in self.blocks for ms in block.latencies_ms]

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0

    @property
    def requests_per_s(self) -> float:
        return statistics.median(block.requests_per_s for block in self.blocks)


def parse_options() -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.speed.proxy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--c1", type=int, default=1000, help="requests per round at c=1")
    parser.add_argument("--c32", type=int, default=4000, help="requests per round at c=32")
    parser.add_argument("--litellm-c1", type=int, default=200, help="LiteLLM requests, c=1")
    parser.add_argument("--litellm-c32", type=int, default=600, help="LiteLLM requests, c=32")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM")
    parser.add_argument(
        "--compare",
        type=Path,
        help="also measure the Reef whose src/reef is in this folder (for instance "
        "`git archive COMMIT src | tar -x -C DIR`)",
    )
    parser.add_argument("--quiet-wait", type=float, default=60, help="max s to wait for quiet")
    parser.add_argument("--time-limit", type=float, default=60, help="max s per block")
    args = parser.parse_args()
    return Options(
        rounds=args.rounds,
        requests={1: args.c1, 32: args.c32},
        litellm_requests={1: args.litellm_c1, 32: args.litellm_c32},
        litellm=not args.no_litellm,
        compare=args.compare,
        quiet_wait_s=args.quiet_wait,
        time_limit_s=args.time_limit,
    )


def measure(targets: list[Target], options: Options, pids: tuple[int, ...]) -> list[Series]:
    """Every target at each concurrency, interleaved over the rounds (the order reversed every
    other round); a block during which other processes took the CPU is measured again once."""
    series = {(t.name, c): Series(t.name, c) for c in options.requests for t in targets}
    for number in range(1, options.rounds + 1):
        console.print(f" round {number} of {options.rounds}", highlight=False)
        for concurrency in options.requests:
            for target in targets if number % 2 else reversed(targets):
                block = measure_block(target, concurrency, options, pids)
                series[target.name, concurrency].blocks.append(block)
    return list(series.values())


def measure_block(
    target: Target, concurrency: int, options: Options, pids: tuple[int, ...]
) -> Block:
    counts = options.litellm_requests if target.name == LITELLM else options.requests
    count = counts[concurrency]
    console.print(f"  {target.name}, concurrency {concurrency}: {count} requests", highlight=False)
    tries = []
    for _ in range(2):
        wait_for_quiet(pids, options.quiet_wait_s)
        tries.append(run_block(target, BODY, concurrency, count, options.time_limit_s, pids))
        if tries[-1].other_cores <= NOISY_CORES:
            break
        console.print(f"    others used {tries[-1].other_cores:.2f} cores meanwhile")
    block = min(tries, key=lambda b: b.other_cores)
    block.receipts = [receipt for b in tries for receipt in b.receipts]  # every one is stored
    if block.failures:
        console.print(f"    [red]{len(block.failures)} failed[/], first: {block.failures[0]}")
    return block


def warm_up(target: Target) -> None:
    """Unmeasured requests (Reef records them in the `warmup` scenario)."""
    warm = Target(target.name, target.url, {**target.headers, "x-reef-scenario": "warmup"})
    for concurrency in (1, 32):
        block = run_block(warm, BODY, concurrency, 64, 60, ())
        if block.failures:
            raise SystemExit(f"warm-up of {target.name} failed: {block.failures[0]}")


def find(series: list[Series], name: str, concurrency: int) -> Series | None:
    return next((s for s in series if s.name == name and s.concurrency == concurrency), None)


def table(series: list[Series]) -> list[dict[str, Any]]:
    rows = []
    for item in series:
        direct = find(series, DIRECT, item.concurrency)
        added = item.percentile(0.5) - direct.percentile(0.5) if direct else 0.0
        rows.append(
            {
                "setting": item.name,
                "c": item.concurrency,
                "requests": len(item.latencies),
                "req_per_s": round(item.requests_per_s, 1),
                "rounds_req_per_s": [round(b.requests_per_s) for b in item.blocks],
                "p50_ms": round(item.percentile(0.5), 3),
                "p95_ms": round(item.percentile(0.95), 3),
                "added_p50_ms": None if item.name == DIRECT else round(added, 3),
                "failed": sum(len(b.failures) for b in item.blocks),
                "noisy_rounds": sum(b.other_cores > NOISY_CORES for b in item.blocks),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'setting':<22} {'c':>3} {'requests':>8} {'req/s':>8} {'rounds':>16} "
    console.print(head + f"{'p50 ms':>8} {'p95 ms':>8} {'+p50 ms':>8} {'failed':>6}", style="bold")
    for row in rows:
        rounds = "-".join(
            str(r) for r in (min(row["rounds_req_per_s"]), max(row["rounds_req_per_s"]))
        )
        added = "" if row["added_p50_ms"] is None else f"{row['added_p50_ms']:.3f}"
        console.print(
            f"{row['setting']:<22} {row['c']:>3} {row['requests']:>8} {row['req_per_s']:>8.0f} "
            f"{rounds:>16} {row['p50_ms']:>8.3f} {row['p95_ms']:>8.2f} {added:>8} "
            f"{row['failed']:>6}",
            highlight=False,
        )


def verdicts(series: list[Series]) -> list[dict[str, Any]]:
    """The two targets of goal 4, each with the baseline it is measured against, and the bare
    forwarder's added latency beside them: the floor under Reef's, not a target."""
    results = []
    reef, direct = find(series, REEF, 1), find(series, DIRECT, 1)
    if reef and direct:
        added = reef.percentile(0.5) - direct.percentile(0.5)
        results.append(
            {
                "target": "added p50 at c=1, Reef vs the direct call",
                "value": f"{added:.3f} ms (Reef {reef.percentile(0.5):.3f}, direct "
                f"{direct.percentile(0.5):.3f})",
                "goal": f"<= {ADDED_P50_TARGET_MS} ms",
                "pass": added <= ADDED_P50_TARGET_MS,
            }
        )
    bare = find(series, BARE, 1)
    if reef and direct and bare:
        floor = bare.percentile(0.5) - direct.percentile(0.5)
        results.append(
            {
                "target": "added p50 at c=1, the bare forwarder vs the direct call",
                "value": f"{floor:.3f} ms; Reef adds {added - floor:.3f} ms more",
                "goal": "none, a floor",
                "pass": None,
            }
        )
    reef32, lite32 = find(series, REEF, 32), find(series, LITELLM, 32)
    if reef32 and lite32:
        ratios = [
            ours.requests_per_s / theirs.requests_per_s
            for ours, theirs in zip(reef32.blocks, lite32.blocks, strict=True)
            if theirs.requests_per_s
        ]
        ratio = statistics.median(ratios) if ratios else 0.0
        results.append(
            {
                "target": "req/s at c=32, Reef vs LiteLLM (median of the rounds' ratios)",
                "value": f"{ratio:.1f}x ({reef32.requests_per_s:.0f} vs "
                f"{lite32.requests_per_s:.0f} req/s; rounds "
                + ", ".join(f"{r:.1f}x" for r in ratios)
                + ")",
                "goal": f">= {THROUGHPUT_TARGET:g}x",
                "pass": ratio >= THROUGHPUT_TARGET,
            }
        )
    return results


def record_check(folder: Path, series: list[Series]) -> dict[str, Any]:
    """Every 200 Reef answered carried a receipt, and the store holds exactly those records."""
    receipts = [r for s in series if s.name == REEF for b in s.blocks for r in b.receipts]
    stored = stored_receipts(folder, SCENARIO)
    complete = complete_records(folder, SCENARIO)
    ok = set(receipts) == stored and len(set(receipts)) == len(receipts) == complete
    return {
        "acknowledged": len(receipts),
        "stored": len(stored),
        "complete": complete,
        "ok": ok,
    }


def main() -> None:
    options = parse_options()
    began = time.perf_counter()
    context: dict[str, Any] = {"cores": 2, "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="reef-proxy-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        names = ("upstream", "reef", "forwarder", "compare", "litellm")
        servers = {name: root / name for name in names}
        for folder in servers.values():
            folder.mkdir()
        upstream = fake_upstream(servers["upstream"])
        stack.callback(upstream.stop)
        started(upstream)
        token = new_key()
        reef = reef_proxy(servers["reef"], upstream.url, token)
        stack.callback(reef.stop)
        context["reef_start_s"] = round(started(reef), 1)
        auth = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        targets = [
            Target(DIRECT, f"{upstream.url}/v1/chat/completions", auth),
            Target(
                REEF,
                f"{reef.url}/v1/chat/completions",
                {**auth, "x-reef-scenario": SCENARIO},
                wants_receipt=True,
            ),
        ]
        pids = [pid_of(upstream), pid_of(reef)]
        forwarder = bare_forwarder(servers["forwarder"], upstream.url)
        stack.callback(forwarder.stop)
        started(forwarder)
        targets.append(Target(BARE, f"{forwarder.url}/v1/chat/completions", auth))
        pids.append(pid_of(forwarder))
        if options.compare is not None:
            other = reef_proxy(servers["compare"], upstream.url, token, options.compare)
            stack.callback(other.stop)
            started(other)
            name = f"Reef @ {options.compare.name}"
            url = f"{other.url}/v1/chat/completions"
            targets.append(Target(name, url, {**auth, "x-reef-scenario": SCENARIO}, True))
            pids.append(pid_of(other))
        if options.litellm:
            venv = ensure_litellm(LITELLM_VENV)
            context["litellm"] = litellm_version(venv)
            key = new_key()
            lite = litellm_proxy(servers["litellm"], upstream.url, key, venv)
            stack.callback(lite.stop)
            console.print("starting LiteLLM ...")
            context["litellm_start_s"] = round(started(lite), 1)
            lite_auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
            targets.append(Target(LITELLM, f"{lite.url}/v1/chat/completions", lite_auth))
            pids.append(pid_of(lite))
        for target in targets:
            warm_up(target)
        context["commit_p50_ms"] = round(commit_probe_ms(root), 3)
        series = measure(targets, options, tuple(pids))
        context["reef_rss_mib"] = round(rss_mib(pid_of(reef)), 0)
        if options.litellm:
            context["litellm_rss_mib"] = round(rss_mib(pids[-1]), 0)
        context["commit_p50_ms_after"] = round(commit_probe_ms(root), 3)
        reef.stop()
        report(series, context, record_check(servers["reef"], series), began)


def report(
    series: list[Series], context: dict[str, Any], records: dict[str, Any], began: float
) -> None:
    console.rule("[bold]Results")
    console.print(
        "Machine: 2 cores shared by the load generator (one aiohttp client), the proxies and the "
        "fake upstream; one short chat request, non-streamed, keep-alive connections. req/s: "
        "median of the rounds; p50/p95 over all rounds; +p50: p50 minus the direct call's.",
        highlight=False,
    )
    rows = table(series)
    print_table(rows)
    console.print(
        f"A durable SQLite commit (WAL, synchronous=FULL, one fsync) on this disk: "
        f"{context['commit_p50_ms']} ms p50 before the rounds, {context['commit_p50_ms_after']} "
        "ms after; Reef waits for one before each answer at c=1.",
        highlight=False,
    )
    console.print(
        f"Memory (RSS): Reef {context.get('reef_rss_mib')} MiB, LiteLLM "
        f"{context.get('litellm_rss_mib', '-')} MiB; start to healthy: Reef "
        f"{context.get('reef_start_s')} s, LiteLLM {context.get('litellm_start_s', '-')} s "
        f"(litellm {context.get('litellm', '-')}, records nothing)",
        highlight=False,
    )
    word = "ok" if records["ok"] else "MISMATCH"
    console.print(
        f"records: {records['acknowledged']} requests acknowledged with a receipt, "
        f"{records['stored']} stored, {records['complete']} complete (request, response, usage): "
        f"{word}",
        highlight=False,
    )
    results = verdicts(series)
    for result in results:
        verdict = {True: "PASS", False: "MISS", None: "FLOOR"}[result["pass"]]
        console.print(
            f"{verdict} {result['target']}: {result['value']} (target {result['goal']})",
            highlight=False,
        )
    OUT.mkdir(exist_ok=True)
    document = {"rows": rows, "context": context, "records": records, "targets": results}
    OUT_FILE.write_text(json.dumps(document, indent=2))
    elapsed = time.perf_counter() - began
    console.print(f"{elapsed:.0f} s in all; figures in {OUT_FILE}", highlight=False)


if __name__ == "__main__":
    main()
