"""skills on a scripted model (answers that depend on the pool) and a scripted proposer: a night's
decisions apply as one change of the tree or none, turns go to the skill they concern, and the
pool's catalog reaches a served request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reef.inference.binding import binding_for
from reef.protocol import ChatRequest, Completion
from reef.recipes.skills.recipe import Skill, Skills, group_of, pool_of
from reef.sdk.recipe import ProposalRefused, StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn
from tests.support.scripted import said

MATHS = Skill("arithmetic", "adding and multiplying numbers", "Work digit by digit.")
TREE = {"AGENTS.md": b"Be helpful.\n", "skills/arithmetic/SKILL.md": MATHS.render()}
PROMPTS = ["What is 12 plus 30? Add the numbers.", "Name a fruit.", "Name a colour."]


def context(decisions: dict[str, dict[str, str]], asked: list[str]) -> StepContext:
    """The model says "Sure" once the pool has a skill named `polite`; the proposer answers by
    the group its question names (the arithmetic skill, or none)."""

    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Completion:
        return said("Sure! 42." if "skills/polite/SKILL.md" in files else "42.")

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        question = messages[0]["content"]
        asked.append(question)
        group = "arithmetic" if "concern the skill arithmetic" in question else ""
        return json.dumps(
            {"name": "", "description": "", "body": "", "merge_into": "", **decisions[group]}
        )

    return StepContext("default", "default@1", dict(TREE), ask=ask, generate_under=generate_under)


def batch() -> list[Trajectory]:
    reports = [{"score": 0.0, "feedback": "Start with Sure"}]
    turns = [
        Turn(f"rec_{n}", [{"role": "user", "content": p}], {"role": "assistant", "content": "x"},
             "default@1", reports)
        for n, p in enumerate(PROMPTS)
    ]  # fmt: skip
    return [Trajectory("t", turns)]


def recipe(**settings: Any) -> Skills:
    loaded = load_recipe("skills", {"scorer": {"type": "regex", "pattern": "^Sure"}, **settings})
    assert isinstance(loaded, Skills)
    return loaded


CREATE = {"decision": "create", "name": "polite", "description": "opening an answer",
          "body": "Open every answer with Sure!"}  # fmt: skip
IMPROVE = {"decision": "improve", "description": "sums", "body": "Add the units first."}


def test_turns_go_to_the_skill_their_request_concerns() -> None:
    pool = pool_of(TREE)
    groups = [group_of(turn.prompt, pool) for turn in batch()[0].turns]
    assert groups == ["arithmetic", "", ""]


POEMS = Skill("poems", "writing short poems about nature", "Four lines, one image.")


@pytest.mark.parametrize(
    ("request_text", "group"),
    [
        ("Multiply 7 by 8.", "arithmetic"),  # multiply ~ multiplying
        ("How do I add two numbers?", "arithmetic"),  # add ~ adding, numbers
        ("Write a poem about the sea.", "poems"),  # write ~ writing, poem ~ poems
        ("Tell me about the weather.", ""),  # "about" and "tell" say nothing of a skill
        ("Tell me a joke.", ""),
    ],
)
def test_a_request_goes_to_the_skill_its_words_stem_from(request_text: str, group: str) -> None:
    pool = {"arithmetic": MATHS, "poems": POEMS}
    assert group_of(request_text, pool) == group


def test_a_night_s_decisions_apply_as_one_change_of_the_tree() -> None:
    asked: list[str] = []
    proposal = recipe().propose(batch(), context({"": CREATE, "arithmetic": IMPROVE}, asked))
    assert proposal is not None and proposal.kind == "harness"
    assert len(asked) == 2  # one decision per group: the arithmetic skill, the no-skill bucket
    assert "Work digit by digit." in next(q for q in asked if "arithmetic:" in q)
    # The night reads what the model answered, not only its score (SkillClaw's night reads the
    # day's traffic).
    assert all("it answered: '42.'" in question for question in asked)
    assert proposal.metrics["night_answers"] == 3 and proposal.metrics["night_answers_cut"] == 0
    pool = pool_of(proposal.files)
    assert sorted(pool) == ["arithmetic", "polite"]
    assert pool["arithmetic"].body == "Add the units first."
    assert pool["polite"].description == "opening an answer"
    assert proposal.files["AGENTS.md"] == TREE["AGENTS.md"]
    assert "create polite" in proposal.reason and "improve arithmetic" in proposal.reason
    assert "0.00 -> 1.00" in proposal.reason  # the next day, on the grown pool
    assert proposal.metrics["pool_before"] == 1 and proposal.metrics["pool_after"] == 2


def test_a_night_with_one_decision_that_breaks_a_rule_applies_none() -> None:
    merge_nowhere = {"decision": "merge", "merge_into": "missing"}
    with pytest.raises(ProposalRefused, match="nothing applied: merge into 'missing'"):
        recipe().propose(batch(), context({"": CREATE, "arithmetic": merge_nowhere}, []))
    with pytest.raises(ProposalRefused, match="over max_skills 1"):
        recipe(max_skills=1).propose(batch(), context({"": CREATE, "arithmetic": IMPROVE}, []))
    taken = {**CREATE, "name": "arithmetic"}
    with pytest.raises(ProposalRefused, match="already exists"):
        recipe().propose(batch(), context({"": taken, "arithmetic": {"decision": "skip"}}, []))


def test_a_night_of_skips_proposes_nothing() -> None:
    skip = {"decision": "skip"}
    with pytest.raises(ProposalRefused, match="every group's decision was skip"):
        recipe().propose(batch(), context({"": skip, "arithmetic": skip}, []))


def test_a_merge_folds_a_skill_into_another_and_removes_it() -> None:
    tree = {**TREE, "skills/sums/SKILL.md": Skill("sums", "adding", "Carry the ones.").render()}
    grown = _night_applied(tree, {"decision": "merge", "merge_into": "sums"})
    assert sorted(pool_of(grown)) == ["sums"]
    assert pool_of(grown)["sums"].body == "Carry the ones.\n\nMerged."


def _night_applied(tree: dict[str, bytes], decided: dict[str, str]) -> dict[str, bytes]:
    from reef.recipes.skills.recipe import Night, NightDecision

    decision = NightDecision("arithmetic", decided["decision"], Skill("x", "", "Merged."),  # type: ignore[arg-type]
                             decided.get("merge_into", ""))  # fmt: skip
    return Night([decision]).applied(tree, max_skills=12)


def test_the_pool_s_catalog_reaches_a_served_request(tmp_path: Path) -> None:
    for path, data in TREE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    binding = binding_for("default@2", "harness", tmp_path)
    asked = ChatRequest.model_validate({"messages": [{"role": "user", "content": "2+2?"}]})
    served = binding.apply(asked)
    system = served.messages[0]
    assert system.role == "system"
    assert "- arithmetic: adding and multiplying numbers" in str(system.content)


def test_the_night_reads_each_answer_within_its_budget_and_counts_the_cuts() -> None:
    asked: list[str] = []
    proposal = recipe(answer_chars=2).propose(
        batch(), context({"": CREATE, "arithmetic": IMPROVE}, asked)
    )
    assert all("it answered: '42…'" in question for question in asked)
    assert proposal is not None and proposal.metrics["night_answers_cut"] == 3
