"""meta_harness on a scripted model (a function whose answers depend on the tree): the full
history reaches the proposer (or the incumbent alone), retention keeps the best and the seed,
and a step proposes only when the paired evidence reaches `min_confidence`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reef.protocol import Completion
from reef.recipes.meta_harness.recipe import (
    MetaHarness,
    Node,
    confidence,
    history_budget,
    search_history,
)
from reef.sdk.prompt_search import SearchTask
from reef.sdk.recipe import Evaluated, ProposalRefused, StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn
from tests.support.scripted import said

PROMPTS = ["Name a fruit.", "What is 2+2?", "Name an animal.", "Name a colour.", "Hi?", "Why?"]
WISH = "Start every answer with the word Sure"


def context(replies: list[str], asked: list[str], sure_on: int = len(PROMPTS)) -> StepContext:
    """Under a tree whose AGENTS.md says Sure, the first `sure_on` prompts answer "Sure!"."""

    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Completion:
        prompt = body["messages"][-1]["content"]
        says = b"Sure" in files.get("AGENTS.md", b"")
        return said("Sure! Yes." if says and PROMPTS.index(prompt) < sure_on else "Yes.")

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        asked.append(messages[0]["content"])
        return replies[min(len(asked), len(replies)) - 1]

    return StepContext("default", "base", {}, ask=ask, generate_under=generate_under)


def batch() -> list[Trajectory]:
    reports = [{"score": 0.0, "feedback": WISH}]
    turns = [
        Turn(
            f"rec_{n}",
            [{"role": "user", "content": p}],
            {"role": "assistant", "content": "x"},
            "base",
            reports,
        )
        for n, p in enumerate(PROMPTS)
    ]
    return [Trajectory("t", turns)]


def recipe(**settings: Any) -> MetaHarness:
    chosen = {"scorer": {"type": "regex", "pattern": "^Sure"}, "max_nodes": 3, **settings}
    loaded = load_recipe("meta_harness", chosen)
    assert isinstance(loaded, MetaHarness)
    return loaded


def tree(agents: str, rules: str = "") -> str:
    return json.dumps({"agents_md": agents, "rules": rules})


def test_a_clearly_better_tree_is_proposed_whole_saying_what_it_rests_on() -> None:
    asked: list[str] = []
    replies = [tree("Be brief."), tree("Say Sure first.", "Always open with Sure."), tree("Hm.")]
    proposal = recipe().propose(batch(), context(replies, asked))
    assert proposal is not None
    assert proposal.files == {
        "AGENTS.md": b"Say Sure first.\n",
        "rules/meta_harness.md": b"Always open with Sure.\n",
    }
    assert "0.00 -> 1.00" in proposal.reason and "6 task(s), 3 tree(s) written" in proposal.reason
    assert proposal.metrics["confidence"] == 1.0
    # full_history: the third proposer call read every retained design, the seed's included.
    assert "Design 0" in asked[2] and "Design 1" in asked[2] and "Design 2" in asked[2]
    assert "Say Sure first." in asked[2] and WISH in asked[2]


def test_incumbent_only_shows_the_proposer_the_best_design_alone() -> None:
    asked: list[str] = []
    replies = [tree("Say Sure first."), tree("Be brief."), tree("Hm.")]
    recipe(mode="incumbent_only").propose(batch(), context(replies, asked))
    assert "Design 1" not in asked[2] and "Say Sure first." in asked[2]


def test_retention_keeps_the_seed_and_the_best() -> None:
    asked: list[str] = []
    replies = [tree("Be brief."), tree("Say Sure first."), tree("Hm.")]
    proposal = recipe(max_candidates=2).propose(batch(), context(replies, asked))
    assert proposal is not None and proposal.metrics["means"] == [0.0, 1.0]
    # Retention limits what may be proposed, not what the proposer reads: the whole search.
    assert "Be brief." in asked[2]


def test_a_gain_on_too_few_tasks_is_refused_naming_what_it_rests_on() -> None:
    """Sure on one prompt of six: better on one task, tied on five, under 0.9 confidence."""
    with pytest.raises(ProposalRefused, match=r"confidence 0\.\d\d, on 6 task\(s\)"):
        recipe().propose(batch(), context([tree("Say Sure first.")], [], sure_on=1))


def test_the_paired_confidence_on_hand_made_differences() -> None:
    assert confidence([1, 1, 1, 1], [0, 0, 0, 0]) == 1.0
    assert confidence([0, 0], [0, 0]) == 0.5
    assert 0.5 < confidence([1, 0, 0, 0, 0, 0], [0] * 6) < 0.9  # one win in six
    assert confidence([1, 1, 1, 1, 0, 1], [0] * 6) > 0.99


def test_every_design_of_realistic_size_is_named_and_the_cut_is_said() -> None:
    """The paper's proposer reads the prior designs' code, scores and raw traces. Four designs
    with files of 1 to 4 kB: in the context the served model leaves (8,192 tokens), every one
    is named with its scores and given whole; in a smaller budget every one is still named, the
    best given whole, and the history says whose files it left out."""
    tasks = [SearchTask(p, WISH) for p in PROMPTS]
    designs = [
        Node({"AGENTS.md": (f"Design {n} says: " + "be careful. " * (90 * (n + 1))).encode()},
             [float(n % 2)] * len(PROMPTS), [f"answer {n}"] * len(PROMPTS))
        for n in range(4)
    ]  # fmt: skip
    assert [len(d.tree["AGENTS.md"]) // 1000 for d in designs] == [1, 2, 3, 4]
    whole = search_history(designs, tasks, [], history_budget(8192))
    assert all(f"Design {n}: mean" in whole for n in range(4))
    assert all(f"Design {n}, its files" in whole for n in range(4)) and "left out" not in whole
    assert "'answer 0'" in whole and WISH in whole  # the raw failing answers, and what was said
    small = search_history(designs, tasks, [], 6000)
    assert len(small) <= 6000 + 100
    assert all(f"Design {n}: mean" in small for n in range(4))  # named, whatever the room
    assert "Design 1, its files" in small  # the best (mean 1, the first of the ties) first
    assert "(left out for room, scores above only: " in small
    earlier = [Evaluated("cand_1", {"AGENTS.md": b"Be terse."}, {"t1": 1.0, "t2": 0.0})]
    with_earlier = search_history(designs[:1], tasks, earlier, history_budget(8192))
    assert "Earlier 0 (cand_1): gate mean 0.50 on 2 task(s)" in with_earlier
    assert "Be terse." in with_earlier and "Its gate's failures: t2" in with_earlier


def test_a_design_carries_the_serving_tree_s_other_files() -> None:
    """A harness release replaces the whole tree: a design naming only AGENTS.md and its rules
    dropped the serving examples, skills and house rules (issue 76). They are carried now; the
    design's own rules file, absent from a design, is its one deliberate deletion."""
    serving = {
        "AGENTS.md": b"Be polite.\n",
        "examples.jsonl": b'{"user": "Hi", "assistant": "Sure! Hello."}\n',
        "skills/math/SKILL.md": b"Add carefully.\n",
        "rules/house.md": b"No emoji.\n",
        "rules/meta_harness.md": b"An earlier design's rule.\n",
    }
    asked: list[str] = []
    replies = [tree("Say Sure first.", "Always open with Sure.")]
    built = context(replies, asked)
    built.files = serving
    proposal = recipe(max_nodes=1).propose(batch(), built)
    assert proposal is not None
    assert proposal.files == {
        **serving,
        "AGENTS.md": b"Say Sure first.\n",
        "rules/meta_harness.md": b"Always open with Sure.\n",
    }
    assert proposal.metrics["history_chars"] > 0
    plain = context([tree("Say Sure first.")], [])
    plain.files = serving
    without_rules = recipe(max_nodes=1).propose(batch(), plain)
    assert without_rules is not None and "rules/meta_harness.md" not in without_rules.files
    assert without_rules.files["rules/house.md"] == b"No emoji.\n"
