"""Checkpoint releases on the real llama.cpp engine: full weights loaded beside the served model,
answering as those weights do, and unloaded only after their last request in flight."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from reef.engines.llamacpp import LlamaCppEngine
from reef.engines.llamacpp import checkpoints as checkpoints_module
from reef.errors import Unsupported
from reef.protocol import ChatRequest
from reef.testing.artifacts import random_checkpoint, random_lora

EOS = 2  # SmolLM2's <|im_end|>
ONE_TOKEN = {
    "messages": [{"role": "user", "content": "Name a colour."}],
    "max_tokens": 1,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 20,
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("artifacts")
    random_lora(folder / "lora", scale=0.3)
    random_checkpoint(folder / "merged", scale=0.3)  # the same adapter, merged in
    return folder


def engine() -> LlamaCppEngine:
    return LlamaCppEngine(n_ctx=256, slots=1, n_threads=2, adaptive_threads=False)


def top_logprobs(completion: object) -> dict[str, float]:
    content = completion.response["choices"][0]["logprobs"]["content"][0]  # type: ignore[attr-defined]
    return {item["token"]: item["logprob"] for item in content["top_logprobs"]}


def shared(a: dict[str, float], b: dict[str, float]) -> int:
    """How many of the 20 likeliest first tokens two answers share."""
    return len(set(a) & set(b))


def test_a_checkpoint_answers_as_its_weights_beside_the_model_it_serves(artifacts: Path) -> None:
    request = ChatRequest.model_validate(ONE_TOKEN)

    async def scenario() -> tuple[dict[str, float], ...]:
        llama = engine()
        await llama.start()
        try:
            base = await llama.complete(request)
            adapted = await llama.complete(request, adapter=artifacts / "lora")
            merged = await llama.complete(request, checkpoint=artifacts / "merged" / "checkpoint")
            assert merged.model == "merged"  # named by the artifact folder: a release's id
            assert llama.checkpoints_loaded == ["merged"]
            again = await llama.complete(request)  # the engine's own model is still there
            return tuple(map(top_logprobs, (base, adapted, merged, again)))
        finally:
            await llama.close()

    base, adapted, merged, again = asyncio.run(scenario())
    assert again == base
    assert shared(base, adapted) <= 10  # the adapter moves the distribution
    assert shared(merged, adapted) >= 15  # and the merged weights move it the same way
    top = max(adapted, key=adapted.__getitem__)
    assert abs(merged[top] - adapted[top]) < 0.5


def test_a_checkpoint_that_goes_finishes_its_request_in_flight_first(
    artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "MAX_CHECKPOINTS", 1)
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    for copy in (first, second):
        shutil.copytree(artifacts / "merged" / "checkpoint", copy)
    long = ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "Count to a hundred."}],
            "max_tokens": 200,
            "logit_bias": {str(EOS): -100},  # never ends early: runs to max_tokens
            "stream": True,
        }
    )

    async def scenario() -> tuple[int, str | None, bool]:
        llama = engine()
        await llama.start()
        try:
            stream = llama.stream(long, checkpoint=first)
            items = [await anext(stream), await anext(stream)]  # it is decoding now
            old = llama._checkpoints._loaded[first / "model.gguf"]
            await llama.load_checkpoint(second)  # the first one goes: it has a request running
            assert old.in_flight == 1
            assert llama.checkpoints_loaded == ["second"]
            assert old._model is not None  # still loaded while its request runs
            items += [item async for item in stream]
            for _ in range(50):
                if old._model is None:
                    break
                await asyncio.sleep(0.1)
            completion = items[-1]
            usage = completion.response["usage"]["completion_tokens"]
            finish = completion.response["choices"][0]["finish_reason"]
            return usage, finish, old._model is None
        finally:
            await llama.close()

    tokens, finish, unloaded = asyncio.run(scenario())
    assert (tokens, finish) == (200, "length")  # the whole answer, on the old weights
    assert unloaded  # and then it went


def test_a_checkpoint_without_a_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hf" / "checkpoint").mkdir(parents=True)
    (tmp_path / "hf" / "checkpoint" / "config.json").write_text("{}")

    async def scenario() -> None:
        llama = engine()
        await llama.start()
        try:
            with pytest.raises(Unsupported, match="no whole-model"):
                await llama.complete(
                    ChatRequest.model_validate(ONE_TOKEN), checkpoint=tmp_path / "hf" / "checkpoint"
                )
        finally:
            await llama.close()

    asyncio.run(scenario())
