"""Does the gate's verdict predict what users get? The greedy gate against the sampled one.

    .venv/bin/python -m bench.learning.gate_predicts_live             # ~10 min on 2 idle cores
    .venv/bin/python -m bench.learning.gate_predicts_live --live 16   # fewer live answers: faster

On the embedded model (llama.cpp, SmolLM2-135M), a preference ("end your answer with the word
Cheers", checked by a regex) and a handful of candidates that try to teach it: the base model
and harnesses saying it in words or showing it in examples. For each candidate, on the same
held-out prompts:

- the gate as it was (today's main before issue 71): one greedy answer per prompt, the rate
  with its 95% Wilson interval over the prompts;
- the gate as served (`gate.samples` answers per prompt at the engine's default temperature,
  seeds `0..k-1`): the rate with its interval over the samples;
- live: `--live` answers per prompt as users get them (the engine's default sampling), on seeds
  the gate never used (from 1000): what the release would serve.

It prints each estimate beside the live rate, whether the live rate lies inside the interval,
and the share of candidates for which it does (the issue's target: at least 90%), and the wall
time of one paired gate run (base against the first harness) greedy and sampled, on the same
engine: what judging as served costs. Figures go to bench/out/gate_predicts_live.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.results import OUT
from reef.engines.llamacpp import LlamaCppEngine
from reef.evaluation.intervals import wilson
from reef.evaluation.runner import (
    EvalSettings,
    beside_traffic,
    model_generate,
    run_paired,
    sample_task,
)
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel

OUT_FILE = OUT / "gate_predicts_live.json"
N_THREADS = 2
MAX_TOKENS = 48
LIVE_SEEDS = 1000  # live answers are drawn on seeds from here: never the gate's
SIGN_OFF = r"(?is)cheers[\s.!]*$"
PROMPTS = [
    "What is a good name for a cat?",
    "How do I boil an egg?",
    "Why is the sky blue?",
    "Suggest a book for a long trip.",
    "What should I cook tonight?",
    "How can I sleep better?",
]
RULE = "End every answer with the word Cheers."
EXAMPLES = (
    ("What is a good drink on a hot day?", "Cold water with lemon. Cheers"),
    ("Name a city in Italy.", "Rome. Cheers"),
)
CANDIDATES = {
    "base": BASE_BINDING,
    "told": Binding(release_id="told", kind="harness", system_prompt=RULE),
    "shown": Binding(release_id="shown", kind="harness", examples=EXAMPLES),
    "told+shown": Binding(
        release_id="told+shown", kind="harness", system_prompt=RULE, examples=EXAMPLES
    ),
}


@dataclass
class Estimate:
    passed: int
    count: int

    @property
    def rate(self) -> float:
        return self.passed / self.count

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed, self.count)

    def holds(self, rate: float) -> bool:
        low, high = self.interval
        return low <= rate <= high

    def said(self) -> str:
        low, high = self.interval
        return f"{self.passed}/{self.count} {self.rate:4.0%} [{low:.0%}-{high:.0%}]"


def tasks() -> list[EvalTask]:
    scorer = ScorerSpec(type="regex", pattern=SIGN_OFF)
    return [
        EvalTask(id=f"p{n}", messages=[{"role": "user", "content": q}], scorer=scorer)
        for n, q in enumerate(PROMPTS)
    ]


async def estimate(
    engine: LlamaCppEngine, binding: Binding, settings: EvalSettings, limit: asyncio.Semaphore
) -> Estimate:
    generate = model_generate(LocalModel(engine), settings)
    sides = await asyncio.gather(
        *(sample_task(task, binding, generate, settings, limit) for task in tasks())
    )
    scores = [score for side in sides for score in side.scores]
    return Estimate(sum(score >= 0.5 for score in scores), len(scores))


async def gate_wall_time(engine: LlamaCppEngine, settings: EvalSettings) -> float:
    generate = model_generate(LocalModel(engine), settings)
    started = time.perf_counter()
    await run_paired(
        tasks(),
        BASE_BINDING,
        CANDIDATES["told"],
        generate,
        settings,
        concurrency=beside_traffic(engine.slots),
    )
    return time.perf_counter() - started


async def run(samples: int, live: int) -> dict[str, Any]:
    engine = LlamaCppEngine(n_ctx=2048, n_threads=N_THREADS)
    await engine.start()
    limit = asyncio.Semaphore(beside_traffic(engine.slots))
    greedy = EvalSettings(temperature=0.0, seed=0, max_tokens=MAX_TOKENS)
    sampled = EvalSettings(temperature=None, seed=0, max_tokens=MAX_TOKENS, samples=samples)
    served = EvalSettings(temperature=None, seed=LIVE_SEEDS, max_tokens=MAX_TOKENS, samples=live)
    rows = {}
    try:
        for name, binding in CANDIDATES.items():
            rows[name] = {
                "greedy": await estimate(engine, binding, greedy, limit),
                "sampled": await estimate(engine, binding, sampled, limit),
                "live": await estimate(engine, binding, served, limit),
            }
            print(f"  {name}: done", flush=True)
        greedy_s = await gate_wall_time(engine, greedy)
        sampled_s = await gate_wall_time(engine, sampled)
    finally:
        await engine.close()
    return report(rows, greedy_s, sampled_s, samples)


def report(
    rows: dict[str, dict[str, Estimate]], greedy_s: float, sampled_s: float, samples: int
) -> dict[str, Any]:
    print(f"\n{'candidate':<12} {'greedy gate (before)':<24} {'sampled gate':<24} live")
    inside = {"greedy": 0, "sampled": 0}
    for name, row in rows.items():
        live = row["live"].rate
        marks = {}
        for gate in inside:
            holds = row[gate].holds(live)
            inside[gate] += holds
            marks[gate] = " " if holds else "!"
        print(
            f"{name:<12} {row['greedy'].said():<22}{marks['greedy']} "
            f"{row['sampled'].said():<22}{marks['sampled']} {row['live'].said()}"
        )
    count = len(rows)
    print("\n(! : the live rate lies outside that gate's 95% interval)")
    for gate, held in inside.items():
        print(f"live inside the {gate} gate's interval: {held}/{count} ({held / count:.0%})")
    print(
        f"\none paired gate run, base against `told`, {len(PROMPTS)} tasks: greedy (before) "
        f"{greedy_s:.1f} s, sampled x{samples} {sampled_s:.1f} s ({sampled_s / greedy_s:.1f}x)"
    )
    return {
        "candidates": {
            name: {
                gate: {"passed": e.passed, "count": e.count, "interval": e.interval}
                for gate, e in row.items()
            }
            for name, row in rows.items()
        },
        "live_inside_interval": {gate: held / count for gate, held in inside.items()},
        "gate_wall_time_s": {"greedy": greedy_s, "sampled": sampled_s},
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8, help="the sampled gate's answers/task")
    parser.add_argument("--live", type=int, default=24, help="live answers per prompt")
    parser.add_argument("--out", type=Path, default=OUT_FILE)
    options = parser.parse_args()
    result = asyncio.run(run(options.samples, options.live))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {options.out}")


if __name__ == "__main__":
    main()
