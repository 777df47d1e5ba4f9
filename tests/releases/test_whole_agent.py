"""One release, the whole agent: a harness and an adapter together, each part kept when a recipe
changes the other, every part restored by rollback and promote, and a head the caller saw
compared-and-swapped end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.artifacts import keep_serving_parts, kind_of, part_of, parts_of
from reef.errors import ReefError
from reef.inference.binding import binding_for
from reef.releases.chain import ReleaseChain, ReleaseConflict
from reef.releases.workflow import _write_files
from reef.testing.artifacts import harness, random_lora
from tests.conftest import needs_git_lfs

HARNESS = {"AGENTS.md": b"Be brief.\n", "examples.jsonl": b'{"user": "Hi", "assistant": "Hi."}\n'}
ADAPTER = {"adapter.gguf": b"weights v1", "peft/adapter_config.json": b"{}"}
NEW_ADAPTER = {"adapter.gguf": b"weights v2", "peft/adapter_config.json": b'{"r": 8}'}


@pytest.mark.parametrize(
    ("path", "part"),
    [
        ("AGENTS.md", "harness"),
        ("rules/style.md", "harness"),
        ("skills/search/SKILL.md", "harness"),
        ("settings.json", "harness"),
        ("adapter.gguf", "adapter"),
        ("adapter.json", "other"),
        ("peft/adapter_model.safetensors", "adapter"),
        ("adapter_config.json", "adapter"),
        ("README.md", "other"),
        ("training_args.bin", "other"),
    ],
)
def test_each_file_belongs_to_one_part(path: str, part: str) -> None:
    assert part_of(path) == part


def test_the_kind_follows_the_parts() -> None:
    assert kind_of(parts_of(HARNESS)) == "harness"
    assert kind_of(parts_of(ADAPTER)) == "lora"
    assert kind_of(parts_of({**HARNESS, **ADAPTER})) == "agent"


def test_a_weight_proposal_keeps_the_serving_harness() -> None:
    kind, files = keep_serving_parts("lora", NEW_ADAPTER, HARNESS)
    assert kind == "agent" and files == {**HARNESS, **NEW_ADAPTER}


def test_a_harness_proposal_keeps_the_serving_adapter_not_a_stale_one() -> None:
    # A harness recipe mutating an earlier candidate's tree may carry that candidate's adapter.
    stale = {"AGENTS.md": b"Be very brief.\n", **ADAPTER}
    kind, files = keep_serving_parts("harness", stale, {**HARNESS, **NEW_ADAPTER})
    assert kind == "agent"
    assert files == {"AGENTS.md": b"Be very brief.\n", **NEW_ADAPTER}  # examples.jsonl dropped


def test_an_agent_proposal_replaces_both_parts() -> None:
    kind, files = keep_serving_parts("agent", {**HARNESS, **NEW_ADAPTER}, {"AGENTS.md": b"Old.\n"})
    assert kind == "agent" and files == {**HARNESS, **NEW_ADAPTER}


def test_on_a_base_head_a_proposal_is_its_own_part_alone() -> None:
    assert keep_serving_parts("lora", NEW_ADAPTER, {}) == ("lora", NEW_ADAPTER)


def test_an_agent_binding_applies_the_harness_and_names_the_adapter(tmp_path: Path) -> None:
    folder = random_lora(harness(tmp_path / "agent", "Answer in one line."))
    binding = binding_for("default@1", "agent", folder, strict=True)
    assert binding.system_prompt == "Answer in one line." and binding.adapter == folder
    only_harness = binding_for("default@2", "harness", harness(tmp_path / "h", "Hi."))
    assert only_harness.adapter is None


def test_a_file_of_neither_part_travels_with_the_release(tmp_path: Path) -> None:
    folder = random_lora(tmp_path / "peft-run")
    (folder / "README.md").write_text("A LoRA trained elsewhere.\n")
    assert binding_for("cand", "lora", folder, strict=True).adapter == folder
    serving = {**ADAPTER, "README.md": b"notes\n"}
    kind, files = keep_serving_parts("harness", HARNESS, serving)
    assert kind == "agent" and files == {**HARNESS, **ADAPTER, "README.md": b"notes\n"}
    renewed = {**NEW_ADAPTER, "README.md": b"new notes\n"}  # a proposal's own notes win
    assert keep_serving_parts("lora", renewed, serving) == ("lora", renewed)


def test_a_harness_candidate_holding_an_adapter_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    _write_files(folder, {**HARNESS, **ADAPTER})
    with pytest.raises(ReefError, match="publish it as kind agent"):
        binding_for("cand", "harness", folder, strict=True)


@pytest.fixture
def chain(tmp_path: Path) -> ReleaseChain:
    needs_git_lfs()
    return ReleaseChain(tmp_path / "releases.git")


def test_the_manifest_lists_the_parts_and_rollback_restores_them_all(chain: ReleaseChain) -> None:
    agent = chain.publish("default", "agent", {**HARNESS, **ADAPTER}, None)
    assert agent.parts == ["harness", "adapter"]
    chain.publish("default", "lora", NEW_ADAPTER, "default@1")
    rolled = chain.rollback("default")
    assert rolled.kind == "agent" and rolled.parts == ["harness", "adapter"]
    assert chain.files(rolled.release_id) == {**HARNESS, **ADAPTER}
    promoted = chain.promote("default@1", "other")
    assert chain.files(promoted.release_id) == {**HARNESS, **ADAPTER}


def test_rollback_and_promote_refuse_a_head_that_moved_since_it_was_seen(
    chain: ReleaseChain,
) -> None:
    chain.publish("default", "harness", HARNESS, None)
    chain.publish("default", "harness", {"AGENTS.md": b"Two.\n"}, "default@1")
    with pytest.raises(ReleaseConflict, match="default@2"):
        chain.rollback("default", expected_head="default@1")
    with pytest.raises(ReleaseConflict, match="default@2"):
        chain.promote("default@1", "default", expected_head="default@1")
    with pytest.raises(ReleaseConflict, match="empty"):
        chain.promote("default@1", "other", expected_head="other@3")
    assert chain.head("default").release_id == "default@2"  # nothing was published
    assert chain.rollback("default", expected_head="default@2").release_id == "default@3"
    assert chain.promote("default@1", "other", expected_head=None).release_id == "other@1"
