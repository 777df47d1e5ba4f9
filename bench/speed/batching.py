"""Batched decoding, per-slot prompt caching and the gate in a batch (issue 11, goals 1 to 3).

    .venv/bin/python -m bench.speed.batching                # all three parts, ~15 min, 2 idle cores
    .venv/bin/python -m bench.speed.batching --part agents  # one part: throughput, agents or gate

Part `throughput`: completion tokens/s of all requests together, and p50 latency, for Reef's
llama.cpp engine and the stock `llama_cpp.server` at concurrency 1 and 4, side by side on
127.0.0.1, in interleaved rounds (a slow spell of the machine hits each alike); and, in every
round, what llama.cpp's own decode gains from a batch of 4 on this machine (`decode_ceiling.py`),
the ceiling for any server on it. `--model GGUF` runs this part on other weights (both servers and
the ceiling load them; `requantize.py` makes a Q4_0 copy of the embedded model).
Part `agents`: two agents send a ~2,000-token conversation at once (concurrency 2), then the
same conversation plus the model's answer and one new message: time to first token of the
second turn against the first, on Reef and on the stock server (with `--interrupt_requests
false`: by default it cuts off a stream when the next request arrives). Part `gate`: the paired
evaluation of a harness candidate on 8 tasks, in process, one request at a time (the baseline)
and as the gate sends them (the engine's slots less one at once): wall time, and whether the
results are identical. (Earlier runs also loaded the engine from before batching out of git;
that source no longer imports beside today's packages: its figures are in docs/benchmarks.md.)

Every figure is printed with its baseline from the same run, and written to
bench/out/batching.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common.ceilings import decode_ceiling, describe
from bench.common.gate_timing import TASKS, paired
from bench.common.prompts import conversation
from bench.common.results import OUT
from bench.common.serving.load import drive
from bench.common.serving.servers import running, stock_llama_server, write_reef_config
from reef.engines.llamacpp import LlamaCppEngine
from reef.evaluation.runner import beside_traffic
from reef.testing.processes import ServerProcess, free_port, reef_serve

OUT_FILE = OUT / "batching.json"
N_THREADS = 2
STORY = "Write a long story about a lighthouse keeper."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["all", "throughput", "agents", "gate"], default="all")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (throughput)")
    parser.add_argument("--requests", type=int, default=8, help="requests per block at c=4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT_FILE)
    parser.add_argument(
        "--model", type=Path, help="throughput on a GGUF other than the embedded model"
    )
    options = parser.parse_args()
    report: dict[str, Any] = {"machine": machine()}
    if options.part in ("all", "throughput"):
        report["throughput"] = throughput(options)
    if options.part in ("all", "agents"):
        report["agents"] = agents()
    if options.part in ("all", "gate"):
        report["gate"] = asyncio.run(gate())
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=2))
    print(f"\nwritten to {options.out}")


def machine() -> dict[str, Any]:
    import os

    return {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg()}


def reef_server(folder: Path, n_ctx: int, model: Path | None = None) -> ServerProcess:
    llamacpp: dict[str, Any] = {"n_ctx": n_ctx, "n_threads": N_THREADS}
    if model is not None:
        llamacpp["model"] = str(model.resolve())
    write_reef_config(folder, {"kind": "llamacpp", "llamacpp": llamacpp})
    return reef_serve(folder, free_port(), "--engine", "llamacpp")


# -- part 1: throughput -------------------------------------------------------------------


def throughput(options: argparse.Namespace) -> dict[str, Any]:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": options.max_tokens,
        "temperature": 0,
    }
    settings = [
        ("Reef c=1", "reef", 1),
        ("Reef c=4", "reef", 4),
        ("llama_cpp.server c=1", "stock", 1),
        ("llama_cpp.server c=4", "stock", 4),
    ]
    blocks: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in settings}
    ceilings: list[dict[int, dict[str, float]]] = []  # one per round, between its blocks
    with tempfile.TemporaryDirectory() as scratch:
        reef_dir, stock_dir = Path(scratch, "reef"), Path(scratch, "stock")
        reef_dir.mkdir()
        stock_dir.mkdir()
        stock = stock_llama_server(stock_dir, logits_all=False, model=options.model)
        with running(reef_server(reef_dir, 2048, options.model)) as reef, running(stock):
            urls = {"reef": reef.url, "stock": stock.url}
            for url in urls.values():  # warm up: model pages in, caches filled
                warm, _ = asyncio.run(drive(url, body, {}, 1, 1, 120, 300))
                if any(sample.error for sample in warm):
                    raise SystemExit(f"warm-up of {url} failed: {warm[0].error}")
            for round_ in range(options.rounds):
                for name, server, concurrency in settings:
                    count = options.requests if concurrency > 1 else max(2, options.requests // 2)
                    samples, wall_s = asyncio.run(
                        drive(urls[server], body, {}, concurrency, count, 600, 600)
                    )
                    failed = [s.error for s in samples if s.error]
                    if failed:
                        raise SystemExit(f"{name}: {failed[0]}")
                    tokens = sum(s.completion_tokens for s in samples)
                    p50 = statistics.median(s.latency_ms for s in samples)
                    blocks[name].append((tokens / wall_s, p50))
                    print(
                        f"round {round_ + 1} {name}: {tokens / wall_s:.1f} tok/s, p50 {p50:.0f} ms"
                    )
                ceilings.append(decode_ceiling(N_THREADS, rounds=1, model=options.model))
                print(f"round {round_ + 1} llama.cpp alone: " + ceiling_line(ceilings[-1]))
    rate = {name: statistics.median(r for r, _ in values) for name, values in blocks.items()}
    p50 = {name: statistics.median(p for _, p in values) for name, values in blocks.items()}
    result = {
        "tokens_per_s": rate,
        "p50_ms": p50,
        "reef_c4_over_reef_c1": rate["Reef c=4"] / rate["Reef c=1"],
        "reef_c1_over_stock_c1": rate["Reef c=1"] / rate["llama_cpp.server c=1"],
        "reef_c4_over_stock_c4": rate["Reef c=4"] / rate["llama_cpp.server c=4"],
        "p50_c4_over_c1": p50["Reef c=4"] / p50["Reef c=1"],
    }
    print("\nthroughput (median of rounds):")
    for name in rate:
        print(f"  {name:24} {rate[name]:7.1f} tokens/s   p50 {p50[name]:8.0f} ms")
    print(f"  Reef c=4 / Reef c=1: {result['reef_c4_over_reef_c1']:.2f}x (target >= 2)")
    result["reef_c1_over_stock_c1_by_round"] = statistics.median(
        reef / stock
        for (reef, _), (stock, _) in zip(
            blocks["Reef c=1"], blocks["llama_cpp.server c=1"], strict=True
        )
    )
    print(
        f"  Reef c=1 / llama_cpp.server c=1: {result['reef_c1_over_stock_c1']:.2f}x (target >= 1; "
        f"round by round {result['reef_c1_over_stock_c1_by_round']:.2f}x)"
    )
    print(
        f"  Reef c=4 / llama_cpp.server c=4: {result['reef_c4_over_stock_c4']:.2f}x (target >= 2)"
    )
    print(
        f"  Reef p50 latency c=4 / c=1:             {result['p50_c4_over_c1']:.2f}x (target <= 2.5)"
    )
    ceiling = {
        size: {key: statistics.median(c[size][key] for c in ceilings) for key in ceilings[0][size]}
        for size in ceilings[0]
    }
    one, four = ceiling[1], ceiling[4]
    result["ceiling"] = {
        "decode": ceiling,
        "tokens_batch4_over_batch1": four["tokens_per_s"] / one["tokens_per_s"],
        "call_batch4_over_batch1": four["ms_per_call"] / one["ms_per_call"],
    }
    print(
        f"\nwhat llama.cpp itself gains from a batch here ({N_THREADS} threads, no server; "
        "measured in every round, medians):"
    )
    print("\n".join(describe(ceiling)))
    share = result["reef_c4_over_reef_c1"] / result["ceiling"]["tokens_batch4_over_batch1"]
    # Each round's Reef c=4 against the batch-4 decode measured in the same round.
    paired = statistics.median(
        reef / alone[4]["tokens_per_s"]
        for (reef, _), alone in zip(blocks["Reef c=4"], ceilings, strict=True)
    )
    result["reef_c4_share_of_ceiling"] = share
    result["reef_c4_over_batch4_decode"] = paired
    print(f"  Reef c=4 / c=1 reaches {share:.0%} of that ceiling (target >= 95%); Reef c=4 makes")
    print(f"  {paired:.0%} of the tokens/s of batch-4 decode alone, round by round")
    print(
        f"  No server on llama.cpp here can exceed "
        f"{result['ceiling']['tokens_batch4_over_batch1']:.2f}x, nor keep its p50 ratio below "
        f"{result['ceiling']['call_batch4_over_batch1']:.2f}x"
    )
    return result


# -- part 2: agents -------------------------------------------------------------------------


def ceiling_line(ceiling: dict[int, dict[str, float]]) -> str:
    return ", ".join(f"batch {n} {r['tokens_per_s']:.1f} tok/s" for n, r in ceiling.items())


async def first_token_s(
    client: httpx.AsyncClient, messages: list[dict[str, str]]
) -> tuple[float, str]:
    """Seconds to the first content token of a streamed answer, and the whole answer."""
    body = {
        "model": "default",
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first, text = None, []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                first = first or time.perf_counter() - started
                text.append(delta["content"])
    return first or time.perf_counter() - started, "".join(text)


async def two_agents(url: str, salt: str) -> dict[str, list[float]]:
    talks = {name: conversation(f"{name}-{salt}") for name in ("A", "B")}
    turns: dict[str, list[float]] = {"first": [], "second": []}
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        for turn in ("first", "second"):
            answers = await asyncio.gather(*(first_token_s(client, m) for m in talks.values()))
            for (seconds, answer), messages in zip(answers, talks.values(), strict=True):
                turns[turn].append(seconds)
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Now say which service wrote the most lines."},
                ]
    return turns


def agents() -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("Reef", "llama_cpp.server"):
            folder = Path(scratch, name)
            folder.mkdir()
            server = reef_server(folder, 4096) if name == "Reef" else stock_server(folder)
            try:
                with running(server):
                    asyncio.run(two_agents(server.url, "warm-up"))
                    turns = asyncio.run(two_agents(server.url, "measured"))
            except httpx.HTTPError as error:  # reported, so the other server's figures stand
                # The log's folder goes with the scratch folder: show its end now.
                log_tail = server.log().strip().splitlines()[-12:]
                result[name] = {"error": f"{type(error).__name__}: {error}", "log": log_tail}
                print(f"{name}: failed ({result[name]['error']}); the end of its log:")
                print("\n".join(f"  | {line}" for line in log_tail))
                continue
            first, second = statistics.median(turns["first"]), statistics.median(turns["second"])
            result[name] = {**turns, "ratio": first / second}
            print(
                f"{name}: first turn TTFT {first:.2f} s, second turn {second:.2f} s: "
                f"{first / second:.1f}x lower (target >= 5 for Reef)"
            )
    return result


def stock_server(folder: Path) -> ServerProcess:
    server = stock_llama_server(folder, logits_all=False)
    server.args[server.args.index("--n_ctx") + 1] = "4096"
    # By default a new request cuts off the stream in progress; the agents take turns instead.
    server.args += ["--interrupt_requests", "false"]
    return server


# -- part 3: the gate ----------------------------------------------------------------------


async def gate() -> dict[str, Any]:
    today = LlamaCppEngine(n_ctx=2048, n_threads=N_THREADS)
    await today.start()
    try:
        serial_s, serial_results = await paired(today, 1)
        # As the gate sends them: a batch that leaves one slot to live traffic.
        batched_s, batched_results = await paired(today, beside_traffic(today.slots))
    finally:
        await today.close()
    result = {
        "today_one_at_a_time_s": serial_s,
        "today_concurrent_s": batched_s,
        "speedup_over_one_at_a_time": serial_s / batched_s,
        "concurrent_identical_to_one_at_a_time": batched_results == serial_results,
    }
    print(f"\ngate on {len(TASKS)} tasks (16 requests):")
    print(f"  one at a time (baseline): {serial_s:6.1f} s")
    print(f"  concurrent, as the gate:  {batched_s:6.1f} s")
    print(f"  speed-up: {result['speedup_over_one_at_a_time']:.2f}x")
    print(f"  concurrent == one at a time: {result['concurrent_identical_to_one_at_a_time']}")
    return result


if __name__ == "__main__":
    sys.exit(main())
