"""The gate's wall time on one engine: eight short tasks evaluated paired (base against a
harness), as the gate evaluates them, `concurrency` requests at a time (`bench.speed.batching`
and `bench.speed.weight_formats` time it)."""

from __future__ import annotations

import time
from typing import Any

from reef.evaluation.runner import EvalSettings, model_generate, run_paired
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest

TASKS = [
    "Name three colours.",
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "Write one sentence about the sea.",
    "What is two plus two?",
    "Name a planet of the solar system.",
    "Say hello in French.",
    "Name an animal that can fly.",
]


async def paired(engine: Any, concurrency: int) -> tuple[float, list[dict[str, Any]]]:
    tasks = [
        EvalTask(
            id=f"t{n}",
            messages=[{"role": "user", "content": q}],
            scorer=ScorerSpec(type="contains", value="e"),
        )
        for n, q in enumerate(TASKS)
    ]
    candidate = Binding(release_id="candidate", kind="harness", system_prompt="Answer briefly.")
    settings = EvalSettings(temperature=0.0, seed=0, max_tokens=48)
    generate = model_generate(LocalModel(engine), settings)
    await generate(
        ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]}), BASE_BINDING
    )
    started = time.perf_counter()
    report = await run_paired(
        tasks, BASE_BINDING, candidate, generate, settings, concurrency=concurrency
    )
    return time.perf_counter() - started, report.summary()["results"]
