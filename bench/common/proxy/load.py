"""The load generator of `python -m bench.speed.proxy`: one aiohttp client on uvloop, keep-alive
connections, the request body encoded once. Its own cost is a small part of each proxy's, so the
client is not what limits the requests/s measured (it still shares the two cores with the
servers).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import aiohttp
import uvloop

from bench.common.serving.cpu import cpu_snapshot, other_cores

RECEIPT = "x-reef-agent-record-id"


@dataclass
class Block:
    """One burst of requests to one server at one concurrency."""

    latencies_ms: list[float] = field(default_factory=list)
    receipts: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    other_cores: float = 0.0  # CPU used meanwhile by processes outside the benchmark

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ms) / self.wall_s if self.wall_s else 0.0

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")


@dataclass(frozen=True)
class Target:
    """A server to load: its chat URL, the headers to send, whether it must hand out receipts."""

    name: str
    url: str
    headers: dict[str, str]
    wants_receipt: bool = False
    pids: tuple[int, ...] = ()


async def _send(session: aiohttp.ClientSession, target: Target, body: bytes, block: Block) -> None:
    started = time.perf_counter()
    try:
        async with session.post(target.url, data=body, headers=target.headers) as response:
            content = await response.read()
            receipt = response.headers.get(RECEIPT)
    except (aiohttp.ClientError, TimeoutError) as error:
        block.failures.append(f"{type(error).__name__}: {error}")
        return
    elapsed_ms = (time.perf_counter() - started) * 1000
    if response.status != 200:
        block.failures.append(f"HTTP {response.status}: {content[:200]!r}")
    elif target.wants_receipt and not receipt:
        block.failures.append("a 200 without a receipt")
    else:
        block.latencies_ms.append(elapsed_ms)
        if receipt:
            block.receipts.append(receipt)


async def _drive(
    target: Target, body: bytes, concurrency: int, count: int, limit_s: float
) -> Block:
    block = Block()
    pending = iter(range(count))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        stop_at = started + limit_s

        async def worker() -> None:
            for _ in pending:
                if time.perf_counter() > stop_at:
                    return
                await _send(session, target, body, block)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        block.wall_s = time.perf_counter() - started
    return block


def run_block(
    target: Target, body: bytes, concurrency: int, count: int, limit_s: float, pids: tuple[int, ...]
) -> Block:
    """`count` requests from `concurrency` connections (stopping early at `limit_s`), with the CPU
    that other processes used meanwhile."""
    before = cpu_snapshot(pids)
    block = uvloop.run(_drive(target, body, concurrency, count, limit_s))
    block.other_cores = other_cores(before, cpu_snapshot(pids), block.wall_s)
    return block
