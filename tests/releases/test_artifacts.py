"""How a harness release changes a request: prompt, rules, skills, examples, settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.artifacts import rebased
from reef.errors import ReefError
from reef.inference.binding import BASE_BINDING, binding_for, compose_system_prompt
from reef.protocol import ChatRequest
from reef.testing.artifacts import harness


def request(**fields: object) -> ChatRequest:
    fields.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return ChatRequest.model_validate(fields)


def roles_and_text(chat: ChatRequest) -> list[tuple[str, str]]:
    return [(m.role, m.text()) for m in chat.messages]


def test_the_prompt_is_agents_then_rules_then_a_skills_index(tmp_path: Path) -> None:
    folder = harness(
        tmp_path, "You are Reef.", rules={"b-tone": "Be calm.", "a-length": "Be brief."}
    )
    (folder / "skills/search").mkdir(parents=True)
    (folder / "skills/search/SKILL.md").write_text("---\ndescription: find things\n---\nbody")
    assert compose_system_prompt(folder) == (
        "You are Reef.\n\n## Rules\n\nBe brief.\n\nBe calm.\n\n## Skills\n\n- search: find things"
    )


def test_prompt_goes_first_or_joins_the_clients_system_message(tmp_path: Path) -> None:
    binding = binding_for("default@1", "harness", harness(tmp_path, "Harness."))
    assert roles_and_text(binding.apply(request())) == [("system", "Harness."), ("user", "Hi")]
    own = request(
        messages=[{"role": "developer", "content": "Client."}, {"role": "user", "content": "Hi"}]
    )
    assert roles_and_text(binding.apply(own)) == [("system", "Harness.\n\nClient."), ("user", "Hi")]


def test_examples_follow_the_system_prompt(tmp_path: Path) -> None:
    folder = harness(tmp_path, "Harness.")
    (folder / "examples.jsonl").write_text('{"user": "Q1", "assistant": "A1"}\n')
    applied = binding_for("default@1", "harness", folder).apply(request())
    assert roles_and_text(applied) == [
        ("system", "Harness."),
        ("user", "Q1"),
        ("assistant", "A1"),
        ("user", "Hi"),
    ]


def test_settings_fill_only_what_the_request_leaves_unset(tmp_path: Path) -> None:
    folder = harness(tmp_path, "H.", settings={"temperature": 0.2, "max_tokens": 7, "colour": "x"})
    binding = binding_for("default@1", "harness", folder)
    applied = binding.apply(request(temperature=0.9))
    assert applied.temperature == 0.9 and applied.max_tokens == 7
    assert "colour" not in applied.model_dump(exclude_unset=True)


def test_base_changes_nothing() -> None:
    original = request()
    assert BASE_BINDING.apply(original) is original


def test_bad_examples_and_settings_are_named(tmp_path: Path) -> None:
    folder = harness(tmp_path, "H.")
    (folder / "examples.jsonl").write_text('{"user": "only a question"}\n')
    with pytest.raises(ReefError, match=r"examples\.jsonl:1"):
        binding_for("x", "harness", folder)
    (folder / "examples.jsonl").unlink()
    (folder / "settings.json").write_text("[1]")
    with pytest.raises(ReefError, match="JSON object"):
        binding_for("x", "harness", folder)


def test_a_lora_artifact_needs_an_adapter(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no weights")
    with pytest.raises(ReefError, match=r"neither a \.gguf adapter"):
        binding_for("x", "lora", tmp_path)


def test_settings_are_checked_as_a_request_would_be(tmp_path: Path) -> None:
    folder = harness(tmp_path, "H.", settings={"temperature": "hot", "max_tokens": 0})
    with pytest.raises(ReefError) as error:
        binding_for("x", "harness", folder)
    assert "temperature" in error.value.message and "max_tokens" in error.value.message
    harness(tmp_path, "H.", settings={"temperature": "0.5", "stop": ["END"]})
    binding = binding_for("x", "harness", folder)
    assert binding.settings == {"temperature": 0.5, "stop": ["END"]}
    assert binding.apply(request()).temperature == 0.5


def test_a_new_candidate_may_not_carry_unknown_settings(tmp_path: Path) -> None:
    folder = harness(tmp_path, "H.", settings={"temperature": 0.2, "colour": "x", "top_k": 3})
    with pytest.raises(ReefError, match=r"unknown key\(s\) 'colour', 'top_k'"):
        binding_for("cand", "harness", folder, strict=True)
    assert binding_for("default@1", "harness", folder).settings["temperature"] == 0.2


def test_a_rebased_candidate_keeps_what_it_changed_and_takes_the_rest_from_the_head() -> None:
    base = {"AGENTS.md": b"Be kind.", "adapter.gguf": b"old weights"}
    candidate = {"AGENTS.md": b"Be brief.", "adapter.gguf": b"old weights"}
    head = {"AGENTS.md": b"Be kind.", "adapter.gguf": b"new weights"}
    kind, files = rebased(candidate, base, head)
    assert files == {"AGENTS.md": b"Be brief.", "adapter.gguf": b"new weights"}
    assert kind == "agent"
    # A part the head dropped and the candidate never touched goes with it.
    assert rebased({"AGENTS.md": b"Be brief."}, {}, {"adapter.gguf": b"w"})[1] == {
        "AGENTS.md": b"Be brief.",
        "adapter.gguf": b"w",
    }
