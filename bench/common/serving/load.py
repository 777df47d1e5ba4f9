"""The load generator: bounded bursts of chat requests, timed, over keep-alive connections.

`drive` sends a number of requests from a number of concurrent connections; `measure_block`
times one such burst for one setting (again when other processes took the CPUs meanwhile), and
`measure_rounds` interleaves every setting over the rounds.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common.serving.config import ENGINE_TIMEOUT_S, Options, console
from bench.common.serving.cpu import (
    ATTEMPTS,
    NOISY_CORES,
    cpu_snapshot,
    other_cores,
    wait_for_quiet,
)
from bench.common.serving.stats import Block, Measurement, Sample


async def send_chat(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> Sample:
    started = time.perf_counter()
    try:
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
    except httpx.HTTPError as error:
        elapsed_ms = (time.perf_counter() - started) * 1000
        return Sample(elapsed_ms, error=f"{type(error).__name__}: {error}")
    elapsed_ms = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        return Sample(elapsed_ms, error=f"HTTP {response.status_code}: {response.text[:200]}")
    data = response.json()
    choice = data["choices"][0]
    logprobs = choice.get("logprobs") or {}
    return Sample(
        latency_ms=elapsed_ms,
        completion_tokens=int((data.get("usage") or {}).get("completion_tokens") or 0),
        text=choice["message"].get("content"),
        has_logprobs=bool(logprobs.get("content")),
    )


async def drive(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    concurrency: int,
    count: int,
    time_limit_s: float,
    timeout_s: float,
) -> tuple[list[Sample], float]:
    """`count` requests from `concurrency` keep-alive connections; stops early at the limit."""
    pending = iter(range(count))
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as client:
        started = time.perf_counter()
        stop_at = started + time_limit_s

        async def worker() -> None:
            for _ in pending:
                if time.perf_counter() > stop_at:
                    return
                samples.append(await send_chat(client, body, headers))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall_s = time.perf_counter() - started
    return samples, wall_s


@dataclass(frozen=True)
class Load:
    """One setting's traffic: which server, which body and headers."""

    part: str
    setting: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = ENGINE_TIMEOUT_S
    server_pids: tuple[int, ...] = ()  # the benchmark's own servers, for the CPU accounting


def measure_block(load: Load, concurrency: int, count: int, options: Options) -> Block:
    """Measure once, or twice when other processes took the CPUs meanwhile; keep the quieter."""
    console.print(
        f"  {load.setting}, concurrency {concurrency}: {count} requests ...", highlight=False
    )
    tries: list[Block] = []
    for attempt in range(1, ATTEMPTS + 1):
        wait_for_quiet(load.server_pids, options.quiet_wait_s)
        tries.append(timed_block(load, concurrency, count, options))
        if tries[-1].other_cores <= NOISY_CORES:
            break
        again = "measuring again" if attempt < ATTEMPTS else "kept, and flagged"
        console.print(
            f"    [yellow]other processes used {tries[-1].other_cores:.2f} cores meanwhile: "
            f"{again}[/]"
        )
    block = min(tries, key=lambda b: b.other_cores)
    block.discarded_ok = sum(len(b.ok) for b in tries if b is not block)
    failed = [s.error for s in block.samples if s.error]
    if failed:
        console.print(f"    [red]{len(failed)} failed[/], first: {failed[0]}")
    if len(block.samples) < count:
        console.print(f"    [yellow]stopped at the time limit after {len(block.samples)}[/]")
    return block


def timed_block(load: Load, concurrency: int, count: int, options: Options) -> Block:
    before = cpu_snapshot(load.server_pids)
    samples, wall_s = asyncio.run(
        drive(
            load.url,
            load.body,
            load.headers,
            concurrency,
            count,
            options.time_limit_s,
            load.timeout_s,
        )
    )
    return Block(samples, wall_s, other_cores(before, cpu_snapshot(load.server_pids), wall_s))


def warm_up(load: Load, count: int) -> None:
    """A few unmeasured requests; recorded ones go to the `warmup` scenario."""
    headers = {**load.headers, "x-reef-scenario": "warmup"}
    samples, _ = asyncio.run(
        drive(load.url, load.body, headers, 1, count, ENGINE_TIMEOUT_S, load.timeout_s)
    )
    failed = [s.error for s in samples if s.error]
    if failed:
        raise RuntimeError(f"warm-up of {load.setting!r} failed: {failed[0]}")


def measure_rounds(
    loads: list[Load], counts: list[tuple[int, int]], options: Options
) -> list[Measurement]:
    """Each load at each (concurrency, total requests), interleaved over `options.rounds`.

    Odd rounds take the loads in order, even rounds in reverse, so no setting always runs
    first or last.
    """
    results = {
        (load.setting, concurrency): Measurement(load.part, load.setting, concurrency)
        for concurrency, _ in counts
        for load in loads
    }
    for number in range(1, options.rounds + 1):
        console.print(f" round {number} of {options.rounds}", highlight=False)
        for concurrency, total in counts:
            per_round = math.ceil(total / options.rounds)
            for load in loads if number % 2 else reversed(loads):
                block = measure_block(load, concurrency, per_round, options)
                results[load.setting, concurrency].blocks.append(block)
    return list(results.values())
