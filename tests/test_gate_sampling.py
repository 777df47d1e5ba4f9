"""The gate samples both sides alike: its temperature and seed override a harness's own, while
the harness's other settings (here max_tokens) apply as they would in serving
(docs/configuration.md, "The gate's sampling"). On the real embedded model."""

from __future__ import annotations

import asyncio

from reef.engines.llamacpp import LlamaCppEngine
from reef.evaluation.runner import EvalSettings, model_generate, run_paired
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel

TASK = EvalTask(
    id="colours",
    messages=[{"role": "user", "content": "Name three colours."}],
    scorer=ScorerSpec(type="contains", value="red"),
)


def test_gate_temperature_and_seed_override_a_harness_but_its_max_tokens_applies(
    engine: LlamaCppEngine,
) -> None:
    wild = {"temperature": 2.0, "seed": 12345, "max_tokens": 4}
    harness = Binding(release_id="candidate", kind="harness", settings=wild)
    settings = EvalSettings(temperature=0.0, seed=0, max_tokens=16)
    generate = model_generate(LocalModel(engine), settings)
    report = asyncio.run(run_paired([TASK], BASE_BINDING, harness, generate, settings))
    [result] = report.tasks
    # Greedy on both sides: the harness's 4 tokens are the start of the base's 16.
    assert result.candidate_answer and len(result.candidate_answer) < len(result.current_answer)
    assert result.current_answer.startswith(result.candidate_answer.strip())
