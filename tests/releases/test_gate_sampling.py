"""The gate samples both sides alike: its temperature and seed override a harness's own, while
the harness's other settings (here max_tokens) apply as they would in serving
(docs/configuration.md, "The gate's sampling"). On a scripted engine, which keeps what each
request asked for."""

from __future__ import annotations

import asyncio

import pytest

from reef.evaluation.runner import EvalSettings, model_generate, run_paired
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest
from reef.testing.scripted_engine import ScriptedEngine

TASK = EvalTask(
    id="colours",
    messages=[{"role": "user", "content": "Name three colours."}],
    scorer=ScorerSpec(type="contains", value="red"),
)


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine("Red, green and blue are three colours that people name first.")


def test_gate_temperature_and_seed_override_a_harness_but_its_max_tokens_applies(
    engine: ScriptedEngine,
) -> None:
    wild = {"temperature": 2.0, "seed": 12345, "max_tokens": 4}
    harness = Binding(release_id="candidate", kind="harness", settings=wild)
    settings = EvalSettings(temperature=0.0, seed=0, max_tokens=16)
    generate = model_generate(LocalModel(engine), settings)
    report = asyncio.run(run_paired([TASK], BASE_BINDING, harness, generate, settings))
    [result] = report.tasks
    asked = {call.request.max_tokens: call.request for call in engine.calls}
    assert sorted(asked) == [4, 16]  # the harness's max_tokens applies on its side
    for request in asked.values():  # both sides greedy, on the gate's seed
        assert (request.temperature, request.seed) == (0.0, 0)
    assert result.current_answer.startswith(result.candidate_answer.strip())


def test_the_paired_run_sends_tasks_concurrently_with_the_same_results(
    engine: ScriptedEngine,
) -> None:
    questions = [
        "Name three colours.",
        "What is 2+2?",
        "Name a fruit.",
        "Say hello.",
        "Name a planet.",
        "What colour is the sky?",
        "Name an animal.",
        "Say goodbye.",
    ]
    tasks = [
        EvalTask(
            id=f"t{n}",
            messages=[{"role": "user", "content": q}],
            scorer=ScorerSpec(type="contains", value="e"),
        )
        for n, q in enumerate(questions)
    ]
    terse = Binding(release_id="candidate", kind="harness", system_prompt="Answer in one word.")
    settings = EvalSettings(temperature=0.0, seed=0, max_tokens=12)
    answer = model_generate(LocalModel(engine), settings)
    flight = {"now": 0, "peak": 0}  # requests in flight, and the most at once

    async def generate(request: ChatRequest, binding: Binding) -> str:
        flight["now"] += 1
        flight["peak"] = max(flight["peak"], flight["now"])
        try:
            return await answer(request, binding)
        finally:
            flight["now"] -= 1

    def run(concurrency: int) -> tuple[list[object], int]:
        flight["peak"] = 0
        report = asyncio.run(
            run_paired(tasks, BASE_BINDING, terse, generate, settings, concurrency=concurrency)
        )
        return report.summary()["results"], flight["peak"]

    one_at_a_time, peak = run(1)
    assert peak == 1
    assert [r["task_id"] for r in one_at_a_time] == [t.id for t in tasks]
    concurrent, peak = run(8)
    assert peak > 1, "the gate sent its tasks one at a time"
    assert concurrent == one_at_a_time
