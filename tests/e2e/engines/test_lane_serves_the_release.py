"""What serves is what was released, with prompts read on a copy of the weights (issue 70).

The prompt lane (engines/llamacpp/handover.py) reads every block of a prompt but its last on a
BF16 copy and hands the keys and values over to the served Q4_1 weights. A LoRA adapter changes
those keys and values, so a lane that read without the release's adapter, or with the adapter
of the release before a hot-swap, would serve another model than the one released. Each check
compares the lane's first answer token with `same` (the served weights read the whole prompt,
under the same adapter) within what BF16's rounding moves it (`NEAR`), on the real embedded
model and a random adapter on the keys and values (`KV_TARGETS`) of all 30 blocks.

Each check is mutation-checked in this module: the same comparison run on an engine whose lane
is made to read without the adapter, or with the previous release's, must fail it, by far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.engines.llamacpp import LlamaCppEngine, handover
from reef.engines.llamacpp.prefill_weights import PrefillSetting
from reef.inference.binding import Binding
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest, Completion
from reef.testing.artifacts import KV_TARGETS, random_lora
from tests.e2e.engines.test_llamacpp_handover import bf16_copy

__all__ = ["bf16_copy"]  # the handover module's fixture: one BF16 copy made the same way

# Three blocks of 64 tokens: the first two are read on the lane.
PROMPT = "Summarise this text. " + "The river runs past the old mill and under the bridge. " * 12
# The first token's log-probability, lane against `same` under one adapter: BF16's rounding moves
# it by at most 0.14 nats here; a lane that reads without the adapter moves it by about two, one
# that reads with the release before's by about half a nat or more.
NEAR = 0.25
KV_SCALE = 0.15  # strong enough to move the answer, weak enough that BF16 stays near Q4_1


def chat(content: str) -> ChatRequest:
    return ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 5,
        }
    )


def make(prefill: PrefillSetting) -> LlamaCppEngine:
    return LlamaCppEngine(
        n_ctx=1024, n_threads=2, slots=2, stop_loops=False, prefill_weights=prefill
    )


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two releases' adapters, as a hot-swap goes from one to the other."""
    folder = tmp_path_factory.mktemp("releases")
    first, second = (
        random_lora(folder / f"default@{n}", scale=KV_SCALE, seed=n, layers=30, targets=KV_TARGETS)
        for n in (1, 2)
    )
    return first, second


@pytest.fixture(scope="module")
def engine(bf16_copy: Path) -> Iterator[LlamaCppEngine]:
    loaded = make(bf16_copy)
    asyncio.run(loaded.start())
    yield loaded
    asyncio.run(loaded.close())


def answers(engine: LlamaCppEngine, *calls: tuple[ChatRequest, Path | None]) -> list[Completion]:
    async def in_turn() -> list[Completion]:
        return [await engine.complete(request, adapter=adapter) for request, adapter in calls]

    return asyncio.run(in_turn())


def on_a_new_engine(
    prefill: PrefillSetting, *calls: tuple[ChatRequest, Path | None]
) -> list[Completion]:
    async def in_turn() -> list[Completion]:
        engine = make(prefill)
        await engine.start()
        try:
            return [await engine.complete(request, adapter=adapter) for request, adapter in calls]
        finally:
            await engine.close()

    return asyncio.run(in_turn())


def first_token_gap(served: Completion, reference: Completion) -> float:
    """How far `served` puts the token `reference` ranks first, in nats (a token it does not
    rank in its top five is as far as its fifth)."""

    def top(answer: Completion) -> dict[str, float]:
        (first, *_) = answer.response["choices"][0]["logprobs"]["content"]
        return {entry["token"]: entry["logprob"] for entry in first["top_logprobs"]}

    wanted, got = top(reference), top(served)
    token = max(wanted, key=wanted.__getitem__)
    return abs(got.get(token, min(got.values())) - wanted[token])


def test_a_long_prompt_reads_on_the_lane_under_the_release_s_adapter(
    engine: LlamaCppEngine, releases: tuple[Path, Path]
) -> None:
    first, _ = releases
    before = engine.prefill["handed_over"]
    (served,) = answers(engine, (chat(PROMPT + " A."), first))
    assert engine.prefill["handed_over"] == before + 1  # the lane read it
    (judged,) = on_a_new_engine("same", (chat(PROMPT + " A."), first))
    assert first_token_gap(served, judged) < NEAR


def test_after_a_hot_swap_the_lane_reads_under_the_new_release(
    engine: LlamaCppEngine, releases: tuple[Path, Path]
) -> None:
    """The same prompt under the release before, then under the new one: the lane holds the
    first release's keys and values, and must not hand them to the second."""
    first, second = releases
    request = chat(PROMPT + " B.")
    _, after_swap = answers(engine, (request, first), (request, second))
    (judged,) = on_a_new_engine("same", (request, second))
    assert first_token_gap(after_swap, judged) < NEAR


def test_a_short_prompt_under_an_adapter_answers_as_same_bit_for_bit(
    engine: LlamaCppEngine, releases: tuple[Path, Path]
) -> None:
    first, _ = releases
    request = chat("Name three colours.")  # one block: read on the served weights
    (served,) = answers(engine, (request, first))
    (judged,) = on_a_new_engine("same", (request, first))
    assert served.token_ids == judged.token_ids
    assert served.token_logprobs == judged.token_logprobs


def test_the_gate_s_path_reads_under_the_candidate_s_adapter(
    engine: LlamaCppEngine, releases: tuple[Path, Path]
) -> None:
    """The gate answers through `LocalModel` (or the server's internal route, which calls the
    same engine) with the candidate's binding: the adapter reaches the lane there too."""
    _, second = releases
    binding = Binding(release_id="cand_x", kind="lora", adapter=second)
    request = chat(PROMPT + " C.")
    served = asyncio.run(LocalModel(engine).complete(request, binding))
    (judged,) = on_a_new_engine("same", (request, second))
    assert first_token_gap(served, judged) < NEAR


# -- the checks above can fail -------------------------------------------------------------------


def test_a_lane_that_reads_without_the_adapter_fails_the_check(
    bf16_copy: Path, releases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = releases
    take = handover.PrefillLane.take

    def without_adapter(self, owner, prompt, start, adapter, held_in):  # type: ignore[no-untyped-def]
        take(self, owner, prompt, start, None, held_in)

    monkeypatch.setattr(handover.PrefillLane, "take", without_adapter)
    (mutant,) = on_a_new_engine(bf16_copy, (chat(PROMPT + " A."), first))
    monkeypatch.undo()
    (judged,) = on_a_new_engine("same", (chat(PROMPT + " A."), first))
    assert first_token_gap(mutant, judged) > NEAR  # the check fails


def test_a_lane_left_at_the_release_before_fails_the_check(
    bf16_copy: Path, releases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = releases
    take = handover.PrefillLane.take

    def kept_at_the_first(self, owner, prompt, start, adapter, held_in):  # type: ignore[no-untyped-def]
        take(self, owner, prompt, start, first if adapter is not None else None, held_in)

    request = chat(PROMPT + " B.")
    monkeypatch.setattr(handover.PrefillLane, "take", kept_at_the_first)
    _, mutant = on_a_new_engine(bf16_copy, (request, first), (request, second))
    monkeypatch.undo()
    (judged,) = on_a_new_engine("same", (request, second))
    assert first_token_gap(mutant, judged) > NEAR  # the check fails


def test_an_adapter_the_lane_cannot_load_is_read_on_the_served_weights_and_said(
    bf16_copy: Path, releases: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never half applied: where the lane's weights refuse an adapter, its prompts are read
    whole on the served weights (as `same`, bit for bit), and the status names it."""
    first, _ = releases
    load = handover.Adapters.load

    def refused_on_the_lane(self, adapter):  # type: ignore[no-untyped-def]
        if adapter is not None and self._model is lane_model[0]:
            raise RuntimeError("llama.cpp could not load the LoRA adapter on these weights")
        load(self, adapter)

    lane_model: list[object] = [None]
    request = chat(PROMPT + " D.")

    async def scenario() -> tuple[Completion, dict]:
        engine = make(bf16_copy)
        await engine.start()
        try:
            assert engine._lane is not None
            lane_model[0] = engine._lane.model.model
            monkeypatch.setattr(handover.Adapters, "load", refused_on_the_lane)
            served = await engine.complete(request, adapter=first)
            return served, engine.prefill
        finally:
            await engine.close()

    served, prefill = asyncio.run(scenario())
    monkeypatch.undo()
    assert prefill["handed_over"] == 0
    assert str(first) in prefill["not_on_lane"]
    (judged,) = on_a_new_engine("same", (request, first))
    assert served.token_ids == judged.token_ids
    assert served.token_logprobs == judged.token_logprobs
