"""A checkpoint candidate in shadow on an engine that holds one set of weights (vLLM's contract:
a checkpoint serves by reloading the only weights): its copies are skipped, since running one
would swap the weights every live request uses. vLLM needs CUDA and did not run here; the engine
below keeps its documented contract (`Capabilities.checkpoints_beside` is False), and the
llama.cpp side, where checkpoints load beside, runs for real in
tests/engines/test_llamacpp_background_checkpoints.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reef.config import ReefConfig
from reef.daemon.shadow import Shadowing, ShadowRunner
from reef.engines.base import Capabilities
from reef.inference.binding import Binding
from reef.protocol import ChatRequest, Completion
from reef.server.in_flight import InFlight
from reef.store import ExperienceStore
from reef.store.experience import Record

RECORD: dict[str, Any] = {
    "request": {"messages": [{"role": "user", "content": "Name a colour."}]},
    "response": {"choices": [{"message": {"role": "assistant", "content": "Blue."}}]},
}


class OneSetOfWeights:
    """An engine whose checkpoints replace the served weights, as vLLM's do."""

    name = "vllm"
    capabilities = Capabilities(checkpoints_beside=False)

    def __init__(self) -> None:
        self.asked: list[Path | None] = []

    async def complete(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> Completion:
        self.asked.append(checkpoint)
        return Completion(response=RECORD["response"], model="m")


def answer_one_copy(binding: Binding, folder: Path) -> tuple[dict[str, int], list[Any]]:
    engine = OneSetOfWeights()
    with ExperienceStore(folder / "experience.db") as store:
        live = Record("default", RECORD["request"], RECORD["response"], "vllm", "base")
        record_id = store.add_record(live).result()
        state = SimpleNamespace(
            config=ReefConfig(),
            engine=engine,
            store=store,
            max_tokens_for=lambda scenario: None,
            in_flight=InFlight(),  # what the server counts: no live call now
        )
        runner = ShadowRunner(state)  # type: ignore[arg-type]
        shadow = Shadowing("cand-1", binding)
        asyncio.run(runner._answer(shadow, "default", record_id))
    return shadow.counts, engine.asked


def test_a_checkpoint_shadow_never_swaps_the_only_weights(tmp_path: Path) -> None:
    binding = Binding(kind="checkpoint", checkpoint=tmp_path / "checkpoint")
    counts, asked = answer_one_copy(binding, tmp_path)
    assert asked == []  # the engine was never asked to load the candidate's weights
    assert counts["skipped"] == 1 and counts["answered"] == 0


def test_a_harness_shadow_on_the_same_engine_answers(tmp_path: Path) -> None:
    counts, asked = answer_one_copy(Binding(kind="harness", system_prompt="Be brief."), tmp_path)
    assert asked == [None]
    assert counts["answered"] == 1
