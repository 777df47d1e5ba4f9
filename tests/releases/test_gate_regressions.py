"""Learning without forgetting, at the gate: a candidate that wins a preference by losing what
the agent knew is refused (naming what it lost), groups of tasks keep their own rules, a
collapsed candidate is rejected, and good answers of the traffic are held back and replayed."""

from __future__ import annotations

import json
from pathlib import Path

from reef.config import GateConfig, GroupRule
from reef.evaluation.replay import HOLD_BACK_ONE_IN, held_back, replay_tasks
from reef.evaluation.runner import PairedReport, TaskResult
from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.releases.gate import decide
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore, Record, Report
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, run_reef


def result(task: str, current: float, candidate: float, group: str = "default") -> TaskResult:
    answers = {1.0: f"a right answer to {task}", 0.0: "Sure!"}
    return TaskResult(task, current, candidate, answers[current], answers[candidate], group)


# Three preference tasks won, two correctness tasks lost: a better mean (0.6 vs 0.4).
TRADE = PairedReport(
    "base",
    [
        result("capital", 1.0, 0.0),
        result("spider-legs", 1.0, 0.0),
        result("gold", 1.0, 1.0),
        result("planets", 1.0, 1.0),
        result("opposite", 0.0, 0.0),
        *[result(f"pref{n}", 0.0, 1.0, "preference") for n in range(3)],
        result("pref3", 0.0, 1.0, "preference"),
    ],
)


def test_the_default_gate_refuses_a_better_mean_that_lost_tasks_and_names_them() -> None:
    assert TRADE.candidate_mean > TRADE.current_mean
    decision, why = decide(GateConfig(), TRADE)
    assert decision == "rejected"
    assert (
        "lost 2 task(s) of group default against the best released: capital (1.00 -> 0.00), "
        "spider-legs (1.00 -> 0.00)"
    ) in why
    assert decide(GateConfig(policy="improve"), TRADE)[0] == "released"  # the mean policy
    held, why = decide(GateConfig(policy="review"), TRADE)
    assert held == "held" and "lost 2 task(s)" in why  # a human sees it too
    assert TRADE.summary()["lost"] == ["capital", "spider-legs"]


def test_groups_keep_their_own_rules() -> None:
    tolerant = GateConfig(groups={"default": GroupRule(rule="keep", margin=1.0)})
    assert decide(tolerant, TRADE)[0] == "released"
    anything = GateConfig(groups={"default": GroupRule(rule="any")})
    assert decide(anything, TRADE)[0] == "released"
    must_improve = GateConfig(
        groups={"default": GroupRule(rule="any"), "preference": GroupRule(rule="improve")}
    )
    assert decide(must_improve, TRADE)[0] == "released"
    no_gain = PairedReport("base", [*TRADE.tasks[:5], result("pref", 1.0, 1.0, "preference")])
    decision, why = decide(must_improve, no_gain)
    assert decision == "rejected" and "group preference does not improve" in why
    floor = GateConfig(groups={"default": GroupRule(rule="floor", floor=0.9)})
    decision, why = decide(floor, TRADE)
    assert decision == "rejected" and "group default is below its floor 0.900 (0.400)" in why


def test_a_group_may_allow_a_count_of_lost_tasks() -> None:
    one_may_go = GateConfig(groups={"default": GroupRule(max_lost=1)})
    decision, why = decide(one_may_go, TRADE)
    at_most = "lost 2 task(s) of group default against the best released (at most 1 may be)"
    assert decision == "rejected" and at_most in why
    two_may_go = GateConfig(groups={"default": GroupRule(max_lost=2)})
    assert decide(two_may_go, TRADE)[0] == "released"


def test_a_candidate_that_says_one_thing_to_every_task_is_rejected_as_collapsed() -> None:
    tasks = [
        TaskResult(f"t{n}", 0.0, 1.0, f"answer {n} about topic {n}", "Sure! Sure!")
        for n in range(6)
    ]
    decision, why = decide(GateConfig(policy="improve"), PairedReport("base", tasks))
    assert decision == "rejected"
    assert "collapsed: 1 distinct answer(s) to 6 tasks (the current release gives 6)" in why
    varied = [
        TaskResult(t.task_id, 0.0, 1.0, t.current_answer, f"Sure! {t.current_answer}")
        for t in tasks
    ]
    assert decide(GateConfig(policy="improve"), PairedReport("base", varied))[0] == "released"


def test_the_reference_scorer_asks_that_the_answer_still_says_what_the_good_one_said() -> None:
    task = EvalTask(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        scorer=ScorerSpec(type="reference", value="The capital of France is Paris."),
    )
    assert score(task.scorer, "Sure! Paris.", task) == 1.0
    assert score(task.scorer, "Sure! Sure!", task) == 0.0
    arithmetic = EvalTask(
        messages=[{"role": "user", "content": "What is 6+3?"}],
        scorer=ScorerSpec(type="reference", value="6+3 is 9."),
    )
    assert score(arithmetic.scorer, "19", arithmetic) == 0.0
    assert score(arithmetic.scorer, "Nine... I mean 9.", arithmetic) == 1.0


def add_scored(store: ExperienceStore, prompt: str, answer: str, value: float) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": prompt}]},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="llamacpp",
        release_id="base",
    )
    store.add_record(record).result()
    store.add_report(Report("default", [record.id], value, None)).result()
    return record.id


def test_one_good_answer_in_four_is_held_back_from_learning_and_replayed(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path / "experience.db") as store:
        good = [add_scored(store, f"Question {n}?", f"Answer number {n}.", 1.0) for n in range(40)]
        bad = [add_scored(store, f"Other {n}?", f"Wrong {n}.", 0.0) for n in range(8)]
        kept_back = [r for r in good if held_back(r)]
        assert 0 < len(kept_back) < len(good)  # about one in HOLD_BACK_ONE_IN
        assert abs(len(kept_back) - len(good) / HOLD_BACK_ONE_IN) < len(good) / 4
        view = ExperienceView(store, "default", consumed=set(), hold_back_at=0.5)
        offered = {turn.record_id for turn in view.turns()}
        assert offered == (set(good) - set(kept_back)) | set(bad)  # a bad answer is never held
        assert view.counts.held_back == len(kept_back)
        assert {t.record_id for t in ExperienceView(store, "default", set()).turns()} == {
            *good,
            *bad,
        }  # without the gate's replay, nothing is held back
        tasks = replay_tasks(store, "default", threshold=0.5, limit=3)
    newest = [r for r in reversed(good) if held_back(r)][:3]
    assert [t.id for t in tasks] == [f"replay:{r}" for r in newest]
    assert all(t.group == "replay" and t.scorer.type == "reference" for t in tasks)
    assert tasks[0].scorer.value and tasks[0].scorer.value.startswith("Answer number")


def test_a_harness_that_trades_correctness_for_a_preference_is_refused_naming_its_losses(
    peer: ServerProcess, tmp_path: Path
) -> None:
    """Through `reef release publish`, on the loopback peer's `words` model (it echoes the
    question, cut to max_tokens words), so the scores are known: the preference wants two words
    at most, correctness the question's last word. A harness that allows two words wins the
    preference tasks and loses the correctness ones (and has not collapsed: its answers differ)."""
    correctness = ["Name the capital of France.", "Count the legs of a spider."]
    tasks = [
        {
            "id": f"right-{n}",
            "messages": [{"role": "user", "content": q}],
            "scorer": {"type": "contains", "value": q.split()[-1].rstrip(".")},
        }
        for n, q in enumerate(correctness)
    ] + [
        {
            "id": f"terse-{n}",
            "group": "preference",
            "messages": [{"role": "user", "content": f"Say anything {n}."}],
            "scorer": {"type": "regex", "pattern": r"^\s*\S+(\s+\S+)?\s*$"},
        }
        for n in range(3)
    ]
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "reef.yaml").write_text(
        f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n    model: words\n"
    )
    terse = harness(tmp_path / "terse", "Answer in two words.", {"max_tokens": 2})
    published = run_reef(tmp_path, "release", "publish", str(terse), "--kind", "harness", "--json")
    assert published.returncode == 1, published.stdout + published.stderr
    candidate = json.loads(published.stdout)
    assert candidate["evaluation"]["candidate_mean"] > candidate["evaluation"]["current_mean"]
    assert candidate["state"] == "rejected"
    lost = (
        "lost 2 task(s) of group default against the best released: right-0 (8/8 -> 0/8), "
        "right-1 (8/8 -> 0/8)"
    )
    assert lost in candidate["decision"]
    assert candidate["evaluation"]["lost"] == ["right-0", "right-1"]
    listed = run_reef(tmp_path, "release", "candidates")
    assert "right-0, right-1" in listed.stdout


# Issue 71: released "0.556 vs 0.222 on 9 tasks" with 0/3 vs 0/3 on what the users asked for.
NO_FEEDBACK_GAIN = PairedReport(
    "base",
    [
        *[result(f"fact{n}", 0.0, 1.0) for n in range(3)],
        *[result(f"fact{n}", 1.0, 1.0) for n in range(3, 5)],
        *[result(f"asked{n}", 0.0, 0.0, "feedback") for n in range(3)],
    ],
)
FEEDBACK_GAIN = PairedReport(
    "base",
    [
        *[result(f"fact{n}", 1.0, 1.0) for n in range(5)],
        *[result(f"asked{n}", 0.0, 1.0, "feedback") for n in range(3)],
    ],
)


def test_a_candidate_that_moved_nothing_the_users_asked_for_is_not_released() -> None:
    assert NO_FEEDBACK_GAIN.candidate_mean > NO_FEEDBACK_GAIN.current_mean
    decision, why = decide(GateConfig(), NO_FEEDBACK_GAIN)
    assert decision == "rejected"
    assert "group feedback does not improve" in why
    assert "feedback 0/3 -> 0/3" in why  # the decision line names each group's counts


def test_a_feedback_gain_that_keeps_the_rest_is_released_with_its_interval() -> None:
    decision, why = decide(GateConfig(), FEEDBACK_GAIN)
    assert decision == "released"
    assert "groups: default 5/5 -> 5/5 [-43%, +43%], feedback 0/3 -> 3/3 [+21%, +100%]" in why


def test_a_scenario_may_hold_the_feedback_group_to_another_rule() -> None:
    keep = GateConfig(groups={"feedback": GroupRule(rule="keep")})
    assert decide(keep, NO_FEEDBACK_GAIN)[0] == "released"
