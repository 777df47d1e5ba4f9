"""self_play on a scripted agent (its answers depend on the task and the attempt's seed) and a
scripted designer: each kind's program computes and checks the answer, the designer's reward is
the regret of the solve rate, only tasks at the edge teach the agent, and the designer reads its
past tasks with their solve rates."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from reef.protocol import Completion
from reef.recipes.self_play.recipe import SelfPlay, _examples, regret
from reef.recipes.self_play.tasks import NotATask, held_out, task_of
from reef.sdk.recipe import ProposalRefused, StepContext, load_recipe
from tests.support.scripted import said

EASY = {"kind": "arithmetic", "a": 2, "op": "+", "b": 3}  # always solved
HARD = {"kind": "arithmetic", "a": 987, "op": "*", "b": 654}  # never
EDGE = {"kind": "reverse", "text": "stone"}  # solved on even seeds


def agent(body: dict[str, Any]) -> Completion:
    prompt = body["messages"][-1]["content"]
    if "2 + 3" in prompt:
        return said("5")
    if "backwards" in prompt:
        return said("enots" if body["seed"] % 2 == 0 else "stone")
    return said("12345")


def context(designs: list[list[dict[str, Any]]], asked: list[str]) -> StepContext:
    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        asked.append(messages[0]["content"])
        return json.dumps({"tasks": designs[len(asked) - 1]})

    return StepContext("default", "base", {}, ask=ask, generate=agent)


def recipe(**settings: Any) -> SelfPlay:
    loaded = load_recipe("self_play", {"every_s": 0, "attempts": 4, **settings})
    assert isinstance(loaded, SelfPlay)
    return loaded


def test_the_designer_s_reward_is_the_regret_of_the_solve_rate() -> None:
    assert [regret(p) for p in (0.0, 0.25, 0.5, 0.75, 1.0)] == [0.0, 0.75, 1.0, 0.75, 0.0]


def test_each_kind_s_program_computes_and_checks_the_answer() -> None:
    product = task_of({"kind": "arithmetic", "a": 37, "op": "*", "b": 12})
    assert product.expected == "444"
    assert product.solved_by("It is 444.") and product.solved_by("37 * 12 = 444")
    assert not product.solved_by("4440") and not product.solved_by("444? No: 440")
    assert re.search(product.pattern, "37 * 12 = 444") and not re.search(product.pattern, "1444")
    assert not re.search(product.pattern, "444, or 445")
    assert task_of({"kind": "count", "text": "banana", "letter": "a"}).expected == "3"
    assert task_of({"kind": "uppercase", "text": "tiger"}).solved_by("TIGER!")
    assert not task_of({"kind": "uppercase", "text": "tiger"}).solved_by("tiger")
    for bad in ({"kind": "poem"}, {"kind": "arithmetic", "a": 1, "op": "/", "b": 2},
                {"kind": "reverse", "text": "two words"}):  # fmt: skip
        with pytest.raises(NotATask):
            task_of(bad)
    assert len(held_out(("arithmetic", "count"), 6, seed=1)) == 6


FRESH = {"kind": "uppercase", "text": "tiger"}


def test_only_the_tasks_at_the_edge_teach_the_agent() -> None:
    asked: list[str] = []
    designs = [[EASY, HARD, EDGE, {"kind": "poem"}], [EDGE, FRESH]]
    proposal = recipe().propose([], context(designs, asked))
    assert proposal is not None and proposal.kind == "harness"
    examples = [json.loads(line) for line in proposal.files["examples.jsonl"].splitlines()]
    assert examples == [
        {"user": "Write the word stone backwards. Answer with one word.", "assistant": "enots"}
    ]
    assert proposal.metrics["solve_rates"] == [1.0, 0.0, 0.5]
    assert proposal.metrics["designed"] == 4 and proposal.metrics["checkable"] == 3
    assert proposal.metrics["designer_reward"] == pytest.approx(1 / 3)
    # Judged on a fresh round, never on the task whose answer the tree now shows.
    (gate_task,) = proposal.eval_tasks
    assert gate_task.messages[0]["content"] == task_of(FRESH).prompt
    assert proposal.metrics["gate_tasks"] == 1
    assert proposal.consumed_record_ids == []


def test_a_round_with_no_task_at_the_edge_proposes_nothing_and_the_designer_remembers() -> None:
    asked: list[str] = []
    playing = recipe()
    with pytest.raises(ProposalRefused, match=r"no designed task at the edge .*\[1.0, 0.0\]"):
        playing.propose([], context([[EASY, HARD], [EDGE], [FRESH]], asked))
    playing.propose([], context([[EASY, HARD], [EDGE], [FRESH]], asked))
    assert "(none yet)" in asked[0]
    assert "What is 2 + 3? Answer with the number only. solved 100% of the time" in asked[1]
    assert "solved 0% of the time" in asked[1]


def test_rounds_need_no_traffic_but_wait_every_s() -> None:
    playing = recipe(every_s=3600)
    assert playing.ready(None) and playing.build_batch(None) == []  # type: ignore[arg-type]
    with pytest.raises(ProposalRefused):
        playing.propose([], context([[EASY]], []))
    assert not playing.ready(None)  # type: ignore[arg-type]


def test_the_tree_keeps_the_newest_worked_examples_one_per_request() -> None:
    old = [{"user": f"q{n}", "assistant": f"a{n}"} for n in range(3)]
    tree = {"examples.jsonl": "".join(json.dumps(e) + "\n" for e in old).encode()}
    kept = _examples(
        tree, [{"user": "q0", "assistant": "again"}, {"user": "q9", "assistant": "new"}], 3
    )
    lines = [json.loads(line) for line in kept.decode().splitlines()]
    # q0, answered again, is now among the newest: q1 is the one that goes.
    assert [e["user"] for e in lines] == ["q2", "q0", "q9"]
    assert lines[1]["assistant"] == "again"


def test_a_solving_answer_with_a_wrong_step_never_becomes_an_example() -> None:
    """Issue 76: "12 - 5 = 8, so the answer is 7" ends on the right number and was kept."""
    minus = {"kind": "arithmetic", "a": 12, "op": "-", "b": 5}

    def sloppy(body: dict[str, Any]) -> Completion:
        if "12 - 5" in body["messages"][-1]["content"]:
            right = "12 - 5 = 7" if body["seed"] == 0 else "12 - 5 = 8, so the answer is 7"
            return said(right if body["seed"] % 2 == 0 else "It is 6.")
        return said("I cannot say.")

    built = context([[minus], [FRESH]], [])
    built.generate = sloppy
    proposal = recipe().propose([], built)
    assert proposal is not None
    assert proposal.metrics["solve_rates"] == [0.25]  # seed 2's wrong step does not count
    examples = [json.loads(line) for line in proposal.files["examples.jsonl"].splitlines()]
    assert [example["assistant"] for example in examples] == ["12 - 5 = 7"]


def test_a_round_with_no_fresh_task_for_the_gate_proposes_nothing_and_says_so() -> None:
    """The designer repeating itself left the gate no task of what was learned: the candidate
    was judged on the eval files alone, without a word."""
    with pytest.raises(ProposalRefused, match="no fresh task for the gate"):
        recipe().propose([], context([[EDGE], [EDGE]], []))
