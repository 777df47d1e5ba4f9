"""Serving benchmark: Reef against the servers it stands in for, measured in one run.

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
requests and in seconds. Run it with:

    .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/serving.py

`--quick` is a smoke run with small counts; `--part engine|upstream` runs one part. The figures
are printed as tables and written to bench/out/serving.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table

from reef.engines.llamacpp import embedded_model_path
from reef.testing.processes import ServerProcess, free_port, reef_serve

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "out" / "serving.json"

# The engine part: one prompt that makes the model write at length, greedy, same for everyone.
PROMPT = "Write a long story about a lighthouse keeper."
SEED = 42
N_CTX = 2048
N_THREADS = 2
ENGINE_CONCURRENCY = (1, 4)
ENGINE_TIMEOUT_S = 300.0

# The upstream part: a short chat the peer echoes back.
UPSTREAM_CONCURRENCY = (1, 32)
UPSTREAM_TIMEOUT_S = 30.0

# The targets Reef is held to.
MAX_RECORDING_COST = 0.03  # recording may cost at most 3% of engine throughput
MAX_ADDED_P50_MS = 2.0  # the upstream proxy may add at most 2 ms at p50, concurrency 1

BASELINE_A = "A: llama_cpp.server"
BASELINE_B = "B: llama_cpp.server, logprobs"
REEF_OFF = "Reef, recording off"
REEF_ON = "Reef, recording on"
REEF_ON_LOGPROBS = "Reef, recording on, logprobs"
REEF_ON_NO_SEED = "Reef, recording on, no seed"
PEER_DIRECT = "peer, direct"
REEF_DEFAULTS = "Reef -> peer, defaults"
REEF_NORMAL = "Reef -> peer, sync normal"
REEF_QUIET_LOG = "Reef -> peer, log warning"

console = Console(width=None if sys.stdout.isatty() else 100)


# -- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    part: str
    rounds: int
    engine_requests: tuple[int, int]
    upstream_requests: tuple[int, int]
    engine_warmup: int
    upstream_warmup: int
    max_tokens: int
    time_limit_s: float
    quiet_wait_s: float
    out: Path


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
        description="Benchmark Reef's serving against stock servers, in one run."
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


# -- measurements -----------------------------------------------------------------------------


@dataclass
class Sample:
    """One request's outcome."""

    latency_ms: float
    completion_tokens: int = 0
    text: str | None = None
    has_logprobs: bool = False
    error: str | None = None


@dataclass
class Block:
    """One timed burst of requests for one setting at one concurrency."""

    samples: list[Sample]
    wall_s: float
    other_cores: float  # CPU used meanwhile by processes outside this benchmark
    discarded_ok: int = 0  # requests served in a noisy attempt that was measured again

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    @property
    def tokens_per_s(self) -> float:
        return sum(s.completion_tokens for s in self.ok) / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s


@dataclass
class Measurement:
    """One setting at one concurrency: its blocks from every round."""

    part: str
    setting: str
    concurrency: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [s for block in self.blocks for s in block.samples]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.samples if s.error is not None]

    @property
    def served(self) -> int:
        """Requests the server answered, noisy attempts measured again included."""
        return len(self.ok) + sum(block.discarded_ok for block in self.blocks)

    @property
    def tokens_per_s(self) -> float:
        return median([block.tokens_per_s for block in self.blocks])

    @property
    def requests_per_s(self) -> float:
        return median([block.requests_per_s for block in self.blocks])

    def latency_ms(self, percent: float) -> float:
        return percentile([s.latency_ms for s in self.ok], percent)

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "concurrency": self.concurrency,
            "requests_ok": len(self.ok),
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
            "completion_tokens": sum(s.completion_tokens for s in self.ok),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "requests_per_s": round(self.requests_per_s, 3),
            "p50_ms": round(self.latency_ms(50), 3),
            "p95_ms": round(self.latency_ms(95), 3),
            "rounds": [
                {
                    "requests_ok": len(block.ok),
                    "wall_s": round(block.wall_s, 4),
                    "tokens_per_s": round(block.tokens_per_s, 3),
                    "requests_per_s": round(block.requests_per_s, 3),
                    "other_cores": round(block.other_cores, 3),
                }
                for block in self.blocks
            ],
        }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: list[float], percent: float) -> float:
    """Linear interpolation between the closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percent / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- CPU accounting: the machine may be shared, so say how busy the rest of it was ------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOISY_CORES = 0.15  # a block during which others used more than this is measured again
ATTEMPTS = 2
QUIET_SAMPLE_S = 1.0


@dataclass(frozen=True)
class CpuSnapshot:
    machine_s: float  # busy CPU seconds of the whole machine since boot
    ours_s: float  # CPU seconds of this process and the benchmark's servers


def cpu_snapshot(server_pids: tuple[int, ...]) -> CpuSnapshot:
    ours = sum(process_cpu_s(pid) for pid in (os.getpid(), *server_pids))
    return CpuSnapshot(machine_busy_s(), ours)


def other_cores(before: CpuSnapshot, after: CpuSnapshot, wall_s: float) -> float:
    """Cores' worth of CPU used between the snapshots by processes outside the benchmark."""
    others = (after.machine_s - before.machine_s) - (after.ours_s - before.ours_s)
    return max(0.0, others) / wall_s if wall_s > 0 else 0.0


def machine_busy_s() -> float:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:  # not Linux: no accounting
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process, all its threads; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def wait_for_quiet(server_pids: tuple[int, ...], limit_s: float) -> None:
    """Wait (at most `limit_s`) until other processes use less than NOISY_CORES."""
    deadline = time.monotonic() + limit_s
    told = False
    while time.monotonic() < deadline:
        before = cpu_snapshot(server_pids)
        time.sleep(QUIET_SAMPLE_S)
        others = other_cores(before, cpu_snapshot(server_pids), QUIET_SAMPLE_S)
        if others <= NOISY_CORES:
            return
        if not told:
            console.print(f"    waiting for other processes to go quiet ({others:.2f} cores) ...")
            told = True
    if told:
        console.print(f"    [yellow]still busy after {limit_s:g} s; measuring anyway[/]")


# -- the load generator -----------------------------------------------------------------------


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


# -- servers ----------------------------------------------------------------------------------


@contextmanager
def running(server: ServerProcess, timeout_s: float = 180.0) -> Iterator[ServerProcess]:
    """Start, yield, and stop (SIGINT, then SIGKILL after 30 s) whatever happens in between."""
    try:
        server.start(timeout=timeout_s)
        yield server
    finally:
        server.stop()


def pids_of(*servers: ServerProcess) -> tuple[int, ...]:
    return tuple(server.process.pid for server in servers if server.process is not None)


def stock_llama_server(folder: Path, logits_all: bool) -> ServerProcess:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(embedded_model_path()),
        "--n_ctx",
        str(N_CTX),
        "--n_threads",
        str(N_THREADS),
        "--n_threads_batch",
        str(N_THREADS),
        # The stock default is logits_all=True; baseline A is the server without it.
        "--logits_all",
        str(logits_all).lower(),
        "--seed",
        str(SEED),
        "--verbose",
        "false",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="llama.log")


def write_reef_config(
    folder: Path, engine: dict[str, Any], synchronous: str = "full", log_level: str = "info"
) -> None:
    config = {
        "engine": engine,
        "store": {"synchronous": synchronous},
        "server": {"log_level": log_level},
    }
    (folder / "reef.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def reef_llamacpp_server(folder: Path) -> ServerProcess:
    engine = {"kind": "llamacpp", "llamacpp": {"n_ctx": N_CTX, "n_threads": N_THREADS}}
    write_reef_config(folder, engine)
    return reef_serve(folder, free_port(), "--engine", "llamacpp")


def openai_peer(folder: Path) -> ServerProcess:
    port = free_port()
    args = [sys.executable, "-m", "reef.testing.openai_peer", "--port", str(port)]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="peer.log")


def reef_upstream_server(
    folder: Path, peer_url: str, synchronous: str = "full", log_level: str = "info"
) -> ServerProcess:
    write_reef_config(folder, {"kind": "upstream"}, synchronous, log_level)
    return reef_serve(
        folder, free_port(), "--engine", "upstream", "--upstream-url", f"{peer_url}/v1"
    )


def new_folder(parent: str, name: str) -> Path:
    folder = Path(parent, name)
    folder.mkdir()
    return folder


def stored_records(folder: Path) -> dict[str, int]:
    """Rows per scenario in the experience store of the (stopped) server run in `folder`."""
    with sqlite3.connect(folder / ".reef" / "experience.db") as db:
        rows = db.execute("SELECT scenario, COUNT(*) FROM records GROUP BY scenario").fetchall()
    return {scenario: int(count) for scenario, count in rows}


# -- part 1: engine throughput ----------------------------------------------------------------


def engine_body(max_tokens: int, logprobs: bool = False, seed: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": max_tokens,
        # llama-cpp-python's own default is 1.1; Reef samples with 1.0 (and ignores the field).
        "repeat_penalty": 1.0,
    }
    if seed:
        # Reef evaluates a seeded request's prompt from scratch (no prefix cache), to make the
        # same seed give the same tokens every time; the stock server reuses the cached prefix.
        body["seed"] = SEED
    if logprobs:
        # llama-cpp-python computes no logprobs for `logprobs: true` without top_logprobs.
        body.update({"logprobs": True, "top_logprobs": 1})
    return body


@dataclass
class EngineRun:
    measurements: list[Measurement]
    checks: list[str]


def run_engine_part(options: Options) -> EngineRun:
    console.rule("[bold]Part 1: engine throughput (llama.cpp)")
    plain = engine_body(options.max_tokens)
    with_logprobs = engine_body(options.max_tokens, logprobs=True)
    unseeded = engine_body(options.max_tokens, seed=False)
    recorded = {"x-reef-scenario": "bench"}
    with tempfile.TemporaryDirectory(prefix="reef-bench-") as tmp, ExitStack() as servers:
        console.print("starting the stock server (twice) and Reef ...")
        stock = servers.enter_context(
            running(stock_llama_server(new_folder(tmp, "stock"), logits_all=False))
        )
        stock_b = servers.enter_context(
            running(stock_llama_server(new_folder(tmp, "stock-b"), logits_all=True))
        )
        reef_folder = new_folder(tmp, "reef")
        reef = servers.enter_context(running(reef_llamacpp_server(reef_folder)))
        pids = pids_of(stock, stock_b, reef)
        off = {"x-reef-capture": "false"}

        def engine_load(
            setting: str,
            server: ServerProcess,
            body: dict[str, Any],
            headers: dict[str, str] | None = None,
        ) -> Load:
            return Load("engine", setting, server.url, body, headers or {}, server_pids=pids)

        loads = [
            engine_load(BASELINE_A, stock, plain),
            engine_load(REEF_OFF, reef, plain, off),
            engine_load(REEF_ON, reef, plain, recorded),
            engine_load(REEF_ON_LOGPROBS, reef, with_logprobs, recorded),
            engine_load(REEF_ON_NO_SEED, reef, unseeded, recorded),
            engine_load(BASELINE_B, stock_b, with_logprobs),
        ]
        for load in loads:
            warm_up(load, options.engine_warmup)
        counts = list(zip(ENGINE_CONCURRENCY, options.engine_requests, strict=True))
        measurements = measure_rounds(loads, counts, options)
        servers.close()  # stop them, so that the store can be read as it is on disk
        checks = [
            record_check(reef_folder, measurements),
            token_count_check(measurements),
            greedy_text_check(measurements),
            logprobs_check(measurements),
        ]
    return EngineRun(measurements, checks)


def record_check(folder: Path, measurements: list[Measurement]) -> str:
    """Recording on stored one row per request, in its scenario; recording off stored none."""
    recorded = sum(
        m.served for m in measurements if m.setting in (REEF_ON, REEF_ON_LOGPROBS, REEF_ON_NO_SEED)
    )
    stored = stored_records(folder)
    bench, unrecorded = stored.get("bench", 0), stored.get("default", 0)
    verdict = "ok" if bench == recorded and unrecorded == 0 else "MISMATCH"
    return (
        f"records: {bench} stored for {recorded} requests with recording on, "
        f"{unrecorded} for recording off ({verdict})"
    )


def token_count_check(measurements: list[Measurement]) -> str:
    counts = sorted({s.completion_tokens for m in measurements for s in m.ok})
    return f"completion tokens per response: {', '.join(map(str, counts))}"


def greedy_text_check(measurements: list[Measurement]) -> str:
    texts = {m.setting: m.ok[0].text for m in measurements if m.ok}
    reference = texts.get(BASELINE_A)
    differing = [name for name, text in texts.items() if text != reference]
    if not differing:
        return "greedy output: every setting wrote the same text"
    return f"greedy output: differs from {BASELINE_A} in: {', '.join(differing)}"


def logprobs_check(measurements: list[Measurement]) -> str:
    parts = []
    for setting in (REEF_ON_LOGPROBS, BASELINE_B):
        samples = [s for m in measurements if m.setting == setting for s in m.ok]
        if samples:
            returned = sum(s.has_logprobs for s in samples)
            parts.append(f"{setting}: {returned}/{len(samples)}")
    return "responses that carry logprobs: " + "; ".join(parts)


# -- part 2: upstream overhead ----------------------------------------------------------------


def upstream_body() -> dict[str, Any]:
    return {"model": "peer", "messages": [{"role": "user", "content": "hello there"}]}


def run_upstream_part(options: Options) -> list[Measurement]:
    console.rule("[bold]Part 2: upstream overhead (Reef as a recording proxy)")
    body = upstream_body()
    with tempfile.TemporaryDirectory(prefix="reef-bench-") as tmp, ExitStack() as servers:
        console.print("starting the peer and three Reef servers in front of it ...")
        peer = servers.enter_context(running(openai_peer(Path(tmp))))
        defaults = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "defaults"), peer.url))
        )
        normal = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "normal"), peer.url, "normal"))
        )
        quiet_log = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "warning"), peer.url, log_level="warning"))
        )
        pids = pids_of(peer, defaults, normal, quiet_log)
        direct = Load(
            "upstream", PEER_DIRECT, peer.url, body, timeout_s=UPSTREAM_TIMEOUT_S, server_pids=pids
        )
        loads = [
            direct,
            replace(direct, setting=REEF_DEFAULTS, url=defaults.url),
            replace(direct, setting=REEF_NORMAL, url=normal.url),
            replace(direct, setting=REEF_QUIET_LOG, url=quiet_log.url),
        ]
        for load in loads:
            warm_up(load, options.upstream_warmup)
        counts = list(zip(UPSTREAM_CONCURRENCY, options.upstream_requests, strict=True))
        return measure_rounds(loads, counts, options)


# -- report -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    limit: float
    unit: str

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        verdict = "[green]PASS[/]" if self.passed else "[red]MISS[/]"
        limit = f"target <= {self.limit:g}{self.unit}"
        return f"{verdict} {self.name}: {self.value:.2f}{self.unit} ({limit})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": round(self.value, 3),
            "limit": self.limit,
            "unit": self.unit,
            "passed": self.passed,
        }


def find(measurements: list[Measurement], setting: str, concurrency: int) -> Measurement | None:
    for m in measurements:
        if m.setting == setting and m.concurrency == concurrency:
            return m
    return None


def paired_ratio(m: Measurement, baseline: Measurement, rate: str) -> float:
    """Median over rounds of m's rate / the baseline's rate in the same round.

    Rounds where other processes took the CPUs (flagged noisy) are left out, unless all were.
    """
    pairs = list(zip(m.blocks, baseline.blocks, strict=True))
    clean = [(a, b) for a, b in pairs if max(a.other_cores, b.other_cores) <= NOISY_CORES]
    ratios = [getattr(a, rate) / getattr(b, rate) for a, b in clean or pairs if getattr(b, rate)]
    return median(ratios)


def ratio_cell(m: Measurement, baseline: Measurement | None, rate: str) -> str:
    value = paired_ratio(m, baseline, rate) if baseline else math.nan
    return "-" if math.isnan(value) else f"{value:.2f}x"


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


def engine_table(measurements: list[Measurement], options: Options) -> Table:
    table = Table(
        title=f"Engine throughput: SmolLM2-135M Q4_1, greedy, max_tokens {options.max_tokens}, "
        f"n_ctx {N_CTX}, {N_THREADS} threads; tok/s: median of {options.rounds} rounds; "
        f"ratio: median of the rounds' tok/s vs {BASELINE_A!r} in the same round",
        caption="A: stock server, --logits_all false.  B: stock server, --logits_all true, "
        "requests ask logprobs (top_logprobs 1), as does 'Reef, recording on, logprobs'.  "
        f"All requests send seed {SEED} but 'no seed'.",
        title_justify="left",
        caption_justify="left",
    )
    columns = ("setting", "c", "requests", "tok/s", "rounds", "p50 ms", "p95 ms", "ratio")
    for name in columns:
        table.add_column(name, justify="left" if name == "setting" else "right")
    for m in sorted(measurements, key=lambda m: m.concurrency):
        baseline = find(measurements, BASELINE_A, m.concurrency)
        table.add_row(
            m.setting,
            str(m.concurrency),
            requests_cell(m),
            f"{m.tokens_per_s:.1f}",
            spread([block.tokens_per_s for block in m.blocks]),
            ms(m.latency_ms(50)),
            ms(m.latency_ms(95)),
            ratio_cell(m, baseline, "tokens_per_s"),
        )
    return table


def upstream_table(measurements: list[Measurement], options: Options) -> Table:
    table = Table(
        title=f"Upstream overhead: chat requests to the loopback peer; req/s: median of "
        f"{options.rounds} rounds; +p50, +p95 vs {PEER_DIRECT!r}; ratio: median of the rounds' "
        "req/s vs it in the same round",
        caption="Reef's defaults: store.synchronous full (an fsync per commit) and "
        "server.log_level info; 'sync normal' changes only the first, 'log warning' only the "
        "second.",
        title_justify="left",
        caption_justify="left",
    )
    columns = ("setting", "c", "requests", "req/s", "p50 ms", "p95 ms", "+p50", "+p95", "ratio")
    for name in columns:
        table.add_column(name, justify="left" if name == "setting" else "right")
    for m in sorted(measurements, key=lambda m: m.concurrency):
        direct = find(measurements, PEER_DIRECT, m.concurrency)
        added = (
            [m.latency_ms(q) - direct.latency_ms(q) for q in (50, 95)]
            if direct is not None and m.setting != PEER_DIRECT
            else []
        )
        table.add_row(
            m.setting,
            str(m.concurrency),
            requests_cell(m),
            f"{m.requests_per_s:.0f}",
            ms(m.latency_ms(50)),
            ms(m.latency_ms(95)),
            *([ms(value) for value in added] if added else ["", ""]),
            ratio_cell(m, direct, "requests_per_s"),
        )
    return table


def requests_cell(m: Measurement) -> str:
    cell = str(len(m.ok))
    if m.errors:
        cell += f" ({len(m.errors)} failed)"
    return cell


def noise_notes(measurements: list[Measurement]) -> list[str]:
    return [
        f"noisy: {m.setting}, c={m.concurrency}, round {number}: other processes "
        f"used {block.other_cores:.2f} cores meanwhile"
        for m in measurements
        for number, block in enumerate(m.blocks, start=1)
        if block.other_cores > NOISY_CORES
    ]


def engine_targets(measurements: list[Measurement]) -> list[Target]:
    targets = []
    for concurrency in ENGINE_CONCURRENCY:
        on = find(measurements, REEF_ON, concurrency)
        off = find(measurements, REEF_OFF, concurrency)
        if on and off:
            cost = 1 - paired_ratio(on, off, "tokens_per_s")
            name = f"cost of recording (1 - on/off tok/s), c={concurrency}"
            targets.append(Target(name, cost * 100, MAX_RECORDING_COST * 100, "%"))
    return targets


def upstream_targets(measurements: list[Measurement]) -> list[Target]:
    targets = []
    direct = find(measurements, PEER_DIRECT, 1)
    for setting in (REEF_DEFAULTS, REEF_NORMAL, REEF_QUIET_LOG):
        reef = find(measurements, setting, 1)
        if direct and reef:
            added = reef.latency_ms(50) - direct.latency_ms(50)
            targets.append(Target(f"added p50, c=1, {setting}", added, MAX_ADDED_P50_MS, " ms"))
    return targets


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama-cpp-python"),
        "reef": version("reef"),
        "git_commit": git_commit(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    host = machine()
    console.print(
        f"Machine: {host['cpus']} CPUs, {host['cpu_model']}; Python {host['python']}, "
        f"llama-cpp-python {host['llama_cpp_python']}, reef {host['reef']} ({host['git_commit']})",
        highlight=False,
    )
    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)],
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
    (e1, e4), (u1, u32) = options.engine_requests, options.upstream_requests
    console.print(
        f"Settings: {options.rounds} rounds; engine: {e1} requests at c=1, {e4} at c=4, "
        f"max_tokens {options.max_tokens}; upstream: {u1} requests at c=1, {u32} at c=32",
        highlight=False,
    )
    started = time.perf_counter()
    targets: list[Target] = []
    tables: list[Table] = []
    notes: list[str] = []
    if options.part in ("engine", "all"):
        engine = run_engine_part(options)
        tables.append(engine_table(engine.measurements, options))
        targets += engine_targets(engine.measurements)
        notes += engine.checks + noise_notes(engine.measurements)
        report["engine"] = {
            "baseline": BASELINE_A,
            "rows": [m.to_json() for m in engine.measurements],
            "checks": engine.checks,
        }
    if options.part in ("upstream", "all"):
        upstream = run_upstream_part(options)
        tables.append(upstream_table(upstream, options))
        targets += upstream_targets(upstream)
        notes += noise_notes(upstream)
        report["upstream"] = {"baseline": PEER_DIRECT, "rows": [m.to_json() for m in upstream]}
    report["targets"] = [t.to_json() for t in targets]
    report["notes"] = notes
    report["elapsed_s"] = round(time.perf_counter() - started, 1)

    console.rule("[bold]Results")
    for table in tables:
        console.print(table)
    for note in notes:
        console.print(note, highlight=False)
    for target in targets:
        console.print(target.line(), highlight=False)
    write_json(options.out, report)
    console.print(f"{report['elapsed_s']} s in all; figures in {options.out}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
