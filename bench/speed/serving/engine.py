"""Part 1, engine throughput: the stock llama.cpp server (baselines A and B) against Reef with
recording on and off, on the embedded SmolLM2-135M GGUF, greedy, the same request for all.

After the rounds, checks that every setting wrote the same text and token counts, that Reef
stored one record per recorded request (none with `x-reef-capture: false`), and which
responses carry logprobs.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.serving.config import (
    BASELINE_A,
    BASELINE_B,
    ENGINE_CONCURRENCY,
    PROMPT,
    REEF_OFF,
    REEF_ON,
    REEF_ON_LOGPROBS,
    REEF_ON_NO_SEED,
    SEED,
    Options,
    console,
)
from bench.common.serving.load import Load, measure_rounds, warm_up
from bench.common.serving.servers import (
    new_folder,
    pids_of,
    reef_llamacpp_server,
    running,
    stock_llama_server,
    stored_records,
)
from bench.common.serving.stats import Measurement
from reef.testing.processes import ServerProcess


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
