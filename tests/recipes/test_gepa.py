"""gepa: the Pareto front and parent draws on hand-made score tables, the minibatch check that
keeps a worse child off the Pareto tasks, the budget, and the recipe's proposal on a scripted
model (a function whose answers depend on the tree, so each outcome is certain)."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from reef.protocol import Completion
from reef.recipes.gepa.recipe import GEPA
from reef.recipes.gepa.search import Rollout, Tree, pareto_front, sample_parent, search
from reef.sdk.recipe import ProposalRefused, RecipeError, StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn
from tests.support.scripted import said

WISH = "Start every answer with the word Sure"
PROMPTS = ["Name a fruit.", "What is 2+2?", "Name an animal.", "What colour is the sky?"]
SCORER = {"type": "regex", "pattern": "^Sure"}


def test_the_front_keeps_each_task_s_winners_that_no_winner_dominates() -> None:
    scores = [
        [1.0, 0.0, 0.0],  # best on task 0, but candidate 2 is as good there and better on 1
        [0.0, 1.0, 0.0],  # best on task 1, dominated by candidate 2 as well
        [1.0, 1.0, 0.0],  # best on tasks 0 and 1
        [0.0, 0.0, 1.0],  # the only one best on task 2, though its mean is the lowest winner's
        [0.0, 0.0, 0.0],  # best nowhere
    ]
    assert pareto_front(scores) == {2: 2, 3: 1}


def test_parents_are_drawn_from_the_front_in_proportion_to_tasks_won() -> None:
    scores = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.5, 0.5]]
    rng = random.Random(7)
    drawn = Counter(sample_parent(scores, rng) for _ in range(3000))
    assert set(drawn) == {1, 2}  # the best mean (candidate 3) wins no task: never a parent
    assert 1.7 < drawn[1] / drawn[2] < 2.3  # two tasks won against one


def scripted_scores(tree: Tree, tasks: list[int]) -> list[Rollout]:
    """1 on every task when the tree says to start with Sure, else 0; task 0 is always 1."""
    says = b"Sure" in tree.get("AGENTS.md", b"")
    return [Rollout(t, f"p{t}", "a", 1.0 if says or t == 0 else 0.0) for t in tasks]


def test_a_child_that_loses_its_minibatch_is_never_scored_on_the_pareto_tasks() -> None:
    evaluated: list[tuple[bytes, tuple[int, ...]]] = []

    def evaluate(tree: Tree, tasks: list[int]) -> list[Rollout]:
        evaluated.append((tree.get("AGENTS.md", b""), tuple(tasks)))
        return [
            Rollout(t, f"p{t}", "a", 0.0 if b"worse" in tree.get("AGENTS.md", b"") else 0.5)
            for t in tasks
        ]

    def reflect(tree: Tree, path: str, rollouts: list[Rollout]) -> Tree:
        return {**tree, path: b"worse"}

    pareto = [0, 1, 2, 3]
    found = search(
        {}, ["AGENTS.md"], pareto, pareto, evaluate, reflect, max_metric_calls=20, minibatch_size=2
    )
    assert len(found.pool) == 1 and found.rejected_on_minibatch >= 3
    assert (b"worse", tuple(pareto)) not in evaluated  # only ever on minibatches of two
    assert all(len(tasks) == 2 for text, tasks in evaluated if text == b"worse")
    assert found.metric_calls >= 20


def test_a_child_that_wins_its_minibatch_joins_the_pool_scored_on_every_pareto_task() -> None:
    def reflect(tree: Tree, path: str, rollouts: list[Rollout]) -> Tree:
        assert [r.score for r in rollouts] != [1.0] * len(rollouts)  # a perfect batch is skipped
        return {**tree, path: b"Start with Sure."}

    found = search(
        {"rules/a.md": b"Be brief."},
        ["AGENTS.md"],
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        scripted_scores,
        reflect,
        max_metric_calls=16,
        minibatch_size=2,
    )
    assert [c.mean for c in found.pool][:2] == [0.25, 1.0]
    assert found.pool[1].parent == 0 and found.pool[1].component == "AGENTS.md"
    assert found.pool[1].tree == {"rules/a.md": b"Be brief.", "AGENTS.md": b"Start with Sure."}
    assert found.best == 1 and found.curve[0] == (4, 0.25) and found.curve[-1][1] == 1.0
    # Once every tree in the front is perfect on its minibatch, no reflection is asked.
    assert found.skipped_perfect >= 1


def turn(number: int, prompt: str) -> Turn:
    reports = [{"score": 0.0, "feedback": WISH}]
    answer = {"role": "assistant", "content": "A banana."}
    return Turn(f"rec_{number}", [{"role": "user", "content": prompt}], answer, "base", reports)


def context(reply: str, asked: list[Any]) -> StepContext:
    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Completion:
        return said("Sure! Here." if b"Sure" in files.get("AGENTS.md", b"") else "Here.")

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 400) -> str:
        asked.append((messages, json_schema, max_tokens))
        return reply

    return StepContext("default", "base", {}, ask=ask, generate_under=generate_under)


def recipe(**settings: Any) -> GEPA:
    chosen = {"batch_size": 4, "scorer": SCORER, "max_metric_calls": 16, "minibatch_size": 2}
    loaded = load_recipe("gepa", {**chosen, **settings})
    assert isinstance(loaded, GEPA)
    return loaded


def batch() -> list[Trajectory]:
    return [Trajectory(f"t{n}", [turn(n, prompt)]) for n, prompt in enumerate(PROMPTS)]


def test_the_recipe_proposes_the_tree_its_reflection_wrote_with_the_search_s_figures() -> None:
    asked: list[Any] = []
    proposal = recipe().propose(batch(), context(json.dumps({"text": "Begin with Sure."}), asked))
    assert proposal is not None and proposal.kind == "harness"
    assert proposal.files == {"AGENTS.md": b"Begin with Sure.\n"}
    assert proposal.metrics["pareto_mean"] == [0.0, 1.0] and proposal.metrics["pool"] == 2
    assert proposal.consumed_record_ids == [f"rec_{n}" for n in range(4)]
    assert proposal.eval_tasks == []  # never its search prompts: the held-out calls judge it
    prompt = asked[0][0][0]["content"]
    assert "AGENTS.md" in prompt and WISH in prompt and "'Here.'" in prompt  # traces and feedback
    assert asked[0][1]["required"] == ["text"]


def test_nothing_is_proposed_when_no_child_beats_the_current_tree() -> None:
    with pytest.raises(ProposalRefused, match="no tree beat the current one"):
        recipe().propose(batch(), context(json.dumps({"text": "Be brief."}), []))
    with pytest.raises(ProposalRefused, match="unusable"):
        recipe().propose(batch(), context("not JSON", []))


def test_gepa_needs_a_scorer_and_waits_for_a_failing_batch() -> None:
    with pytest.raises(RecipeError, match="needs `scorer`"):
        recipe(scorer=None).propose(batch(), context("{}", []))
    with pytest.raises(RecipeError, match="components"):
        load_recipe("gepa", {"components": ["everything"]})
