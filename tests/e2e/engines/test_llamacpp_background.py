"""Background jobs on the real llama.cpp engine (a shadow's copies): they take a slot only while
no live request runs, wait while one does, and give their slot up to one that needs it."""

from __future__ import annotations

import asyncio

import pytest

from reef.engines.llamacpp import LlamaCppEngine, Preempted
from reef.errors import Overloaded
from reef.protocol import ChatRequest, Completion

EOS = 2  # SmolLM2's <|im_end|>


def request(tokens: int) -> ChatRequest:
    return ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "Count to a hundred."}],
            "max_tokens": tokens,
            "temperature": 0,
            "logit_bias": {str(EOS): -100},  # runs to max_tokens
        }
    )


def run(slots: int, scenario):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        engine = LlamaCppEngine(n_ctx=512, slots=slots, n_threads=2, adaptive_threads=False)
        await engine.start()
        try:
            return await scenario(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def test_a_live_request_takes_the_only_slot_from_a_background_job() -> None:
    async def scenario(engine: LlamaCppEngine) -> tuple[BaseException | Completion, Completion]:
        background = asyncio.create_task(engine.complete(request(300), background=True))
        await asyncio.sleep(0.5)  # it is decoding now
        live = await engine.complete(request(8))
        outcome = await asyncio.gather(background, return_exceptions=True)
        return outcome[0], live

    background, live = run(1, scenario)
    assert isinstance(background, Preempted)
    assert live.usage is not None and live.usage["completion_tokens"] == 8


def test_a_background_job_waits_while_a_live_one_runs_then_finishes() -> None:
    order: list[str] = []

    async def timed(name: str, call):  # type: ignore[no-untyped-def]
        result = await call
        order.append(name)
        return result

    async def scenario(engine: LlamaCppEngine) -> list[Completion]:
        background = asyncio.create_task(
            timed("background", engine.complete(request(40), background=True))
        )
        await asyncio.sleep(0.2)
        live = await timed("live", engine.complete(request(60)))
        return [await background, live]

    background, live = run(2, scenario)
    assert order == ["live", "background"]  # it started first, and let the live one through
    assert background.usage is not None and background.usage["completion_tokens"] == 40
    assert live.usage is not None and live.usage["completion_tokens"] == 60


def test_background_work_is_refused_while_a_live_request_is_in_flight() -> None:
    async def scenario(engine: LlamaCppEngine) -> None:
        live = asyncio.create_task(engine.complete(request(30)))
        await asyncio.sleep(0.1)
        with pytest.raises(Overloaded, match="background work waits for an idle engine"):
            await engine.complete(request(5), background=True)
        await live

    run(2, scenario)
