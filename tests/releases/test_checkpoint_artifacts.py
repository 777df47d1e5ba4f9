"""Checkpoint artifacts (full weights under `checkpoint/`): which files are which part, what a
proposal keeps of the serving release, what its binding serves, and where training reads them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reef.artifacts import CHECKPOINT, keep_serving_parts, kind_of, part_of, parts_of
from reef.engines.upstream import UpstreamEngine
from reef.errors import ReefError, Unsupported
from reef.inference.binding import binding_for
from reef.protocol import ChatRequest
from reef.sdk.recipe import StepContext, load_recipe
from reef.sdk.weights import forget_other_checkpoints, proposal_kind, training_source
from reef.testing.artifacts import harness, random_lora

HARNESS = {"AGENTS.md": b"Be brief.\n"}
ADAPTER = {"adapter.gguf": b"lora", "peft/adapter_config.json": b"{}"}
WEIGHTS = {"checkpoint/model.gguf": b"GGUF v1"}
NEW_WEIGHTS = {"checkpoint/model.gguf": b"GGUF v2"}


def test_files_under_checkpoint_are_the_checkpoint_part_gguf_or_not() -> None:
    assert part_of("checkpoint/model.gguf") == CHECKPOINT  # not an adapter's GGUF
    assert part_of("checkpoint/config.json") == CHECKPOINT
    assert part_of("checkpoint/model.safetensors") == CHECKPOINT
    assert part_of("checkpoint.md") == "other"
    assert parts_of({**HARNESS, **ADAPTER, **WEIGHTS}) == ["harness", "adapter", "checkpoint"]
    assert kind_of(["harness", "checkpoint"]) == "checkpoint"


def test_a_checkpoint_proposal_keeps_the_harness_and_drops_the_adapter_it_merged() -> None:
    kind, files = keep_serving_parts("checkpoint", NEW_WEIGHTS, {**HARNESS, **ADAPTER, **WEIGHTS})
    assert (kind, files) == ("checkpoint", {**HARNESS, **NEW_WEIGHTS})


@pytest.mark.parametrize("kind", ["lora", "harness", "agent"])
def test_a_proposal_on_a_serving_checkpoint_keeps_its_weights(kind: str) -> None:
    own = {"lora": ADAPTER, "harness": HARNESS, "agent": {**HARNESS, **ADAPTER}}[kind]
    made, files = keep_serving_parts(kind, own, {"AGENTS.md": b"Old.\n", **WEIGHTS})
    assert made == "checkpoint"
    assert files["checkpoint/model.gguf"] == b"GGUF v1"
    assert files["AGENTS.md"] == (b"Be brief.\n" if kind != "lora" else b"Old.\n")


def test_a_checkpoint_binding_names_its_weights_its_harness_and_an_adapter_beside(
    tmp_path: Path,
) -> None:
    folder = harness(tmp_path / "release", "Answer in one line.")
    (folder / "checkpoint").mkdir()
    (folder / "checkpoint" / "model.gguf").write_bytes(b"GGUF")
    binding = binding_for("default@3", "checkpoint", folder, strict=True)
    assert binding.checkpoint == folder / "checkpoint"
    assert binding.system_prompt == "Answer in one line."
    assert binding.adapter is None  # the checkpoint's GGUF is no adapter
    random_lora(folder)
    assert binding_for("default@3", "checkpoint", folder).adapter == folder


def test_a_checkpoint_without_weights_and_a_lora_holding_them_are_refused(
    tmp_path: Path,
) -> None:
    empty = harness(tmp_path / "empty", "Hi.")
    with pytest.raises(ReefError, match="neither checkpoint/"):
        binding_for("cand", "checkpoint", empty, strict=True)
    lora = random_lora(tmp_path / "lora")
    (lora / "checkpoint").mkdir()
    (lora / "checkpoint" / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ReefError, match="holds checkpoint files"):
        binding_for("cand", "lora", lora, strict=True)


def test_training_reads_the_serving_checkpoint_written_once_by_content(tmp_path: Path) -> None:
    served = tmp_path / "SmolLM2.gguf"
    context = StepContext(
        scenario="default",
        release_id="default@2",
        files={**HARNESS, **WEIGHTS},
        model_path=served,
        work_dir=tmp_path / "work",
    )
    source = training_source(context)
    assert source.name == "model.gguf" and source.read_bytes() == b"GGUF v1"
    assert training_source(context) == source  # the same content, the same file
    context.files = {**HARNESS, **NEW_WEIGHTS}
    assert training_source(context) != source
    context.files = dict(HARNESS)
    assert training_source(context) == served  # no checkpoint: the engine's model


def test_training_keeps_the_files_of_the_checkpoint_it_trains_on_only(tmp_path: Path) -> None:
    work = tmp_path / "work"
    context = StepContext(
        "default", "default@1", {**WEIGHTS}, model_path=tmp_path / "m.gguf", work_dir=work
    )
    old = training_source(context)
    context.files = {**NEW_WEIGHTS}
    new = training_source(context)
    # load_base's float32 copies, each naming the GGUF it came from.
    for name, origin in (("old", old), ("new", new), ("served", tmp_path / "m.gguf")):
        (work / "base" / name).mkdir(parents=True)
        (work / "base" / name / "reef_source.json").write_text(json.dumps({"gguf": str(origin)}))
    forget_other_checkpoints(work, new)
    assert new.is_file() and not old.exists()
    assert sorted(p.name for p in (work / "base").iterdir()) == ["new", "served"]


def test_a_weight_recipe_proposes_a_checkpoint_when_its_settings_ask() -> None:
    for name in ("sft", "openclaw_rl", "tttd"):
        assert proposal_kind(load_recipe(name, {}).settings) == "lora"
        assert proposal_kind(load_recipe(name, {"checkpoint": True}).settings) == "checkpoint"


def test_the_upstream_engine_refuses_a_checkpoint_before_calling_out(tmp_path: Path) -> None:
    engine = UpstreamEngine(base_url="http://127.0.0.1:9/v1")  # nothing listens: never called
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]})

    async def scenario() -> None:
        await engine.start()
        try:
            with pytest.raises(Unsupported, match="cannot serve checkpoint releases"):
                await engine.complete(request, checkpoint=tmp_path)
        finally:
            await engine.close()

    asyncio.run(scenario())
