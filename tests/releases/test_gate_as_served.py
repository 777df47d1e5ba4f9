"""The gate judges as the scenario is served: each task answered `gate.samples` times at the
serving temperature, rules read on rates with their noise, and the feedback group decides.

Answers come from a scripted engine whose answer depends on the side (the candidate is a harness
whose system prompt says `candidate`) and on the request's seed, so each sample's score is
certain: the gate sends sample i on seed `gate.seed + i` on both sides.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from reef.config import GateConfig
from reef.evaluation.reference import best_released
from reef.evaluation.runner import EvalSettings, PairedReport, model_generate, run_paired
from reef.evaluation.served import served_settings
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest
from reef.releases.gate import decide
from reef.store import ExperienceStore, Record
from reef.testing.scripted_engine import ScriptedEngine

CANDIDATE = Binding(release_id="candidate", kind="harness", system_prompt="candidate")
SAMPLES = 8
# Which seeds (samples) each side passes a task on: {task: (current's, candidate's)}.
Passing = dict[str, tuple[set[int], set[int]]]


def task(name: str, group: str) -> EvalTask:
    return EvalTask(
        id=name,
        messages=[{"role": "user", "content": f"Answer {name}."}],
        scorer=ScorerSpec(type="contains", value="right"),
        group=group,
    )


def scripted(passing: Passing) -> ScriptedEngine:
    def answer(request: ChatRequest) -> str:
        name = str(request.messages[-1].content).split()[-1].rstrip(".")
        side = 1 if request.messages[0].content == "candidate" else 0
        return "right" if request.seed in passing[name][side] else "wrong"

    return ScriptedEngine(answer)


def evaluate(
    passing: Passing, groups: dict[str, str], settings: EvalSettings
) -> tuple[PairedReport, ScriptedEngine]:
    engine = scripted(passing)
    tasks = [task(name, groups[name]) for name in passing]
    generate = model_generate(LocalModel(engine), settings)
    report = asyncio.run(run_paired(tasks, BASE_BINDING, CANDIDATE, generate, settings))
    return report, engine


SAMPLED = EvalSettings(temperature=1.0, seed=0, max_tokens=16, samples=SAMPLES)
GREEDY = EvalSettings(temperature=0.0, seed=0, max_tokens=16, samples=SAMPLES)
ALL = set(range(SAMPLES))
GROUPS = {"sum": "correctness", "capital": "correctness", "f0": "feedback", "f1": "feedback"}
GROUPS |= {"f2": "feedback"}
# The candidate learned the feedback (7 of 8 samples on each held-out prompt); on `sum` the base
# happened to pass its first sample only and the candidate two others: one greedy answer says
# the candidate lost `sum`, its samples say nothing was lost.
LEARNED: Passing = {
    "sum": ({0}, {3, 5}),
    "capital": (ALL, ALL),
    **{f"f{n}": (set(), ALL - {n}) for n in range(3)},
}


def test_each_task_is_answered_samples_times_on_seeds_alike_on_both_sides() -> None:
    report, engine = evaluate(LEARNED, GROUPS, SAMPLED)
    seeds = sorted(call.request.seed for call in engine.calls if call.request.seed is not None)
    assert seeds == sorted(list(range(SAMPLES)) * 2 * len(LEARNED))
    assert {call.request.temperature for call in engine.calls} == {1.0}
    [sum_task] = [t for t in report.tasks if t.task_id == "sum"]
    assert (sum_task.current_passes, sum_task.candidate_passes, sum_task.samples) == (1, 2, 8)
    assert sum_task.current_score == 1 / 8 and len(sum_task.candidate_answers) == SAMPLES
    assert report.summary()["sampling"] == {
        "temperature": 1.0,
        "seed": 0,
        "max_tokens": 16,
        "samples": SAMPLES,
    }


def test_a_feedback_gain_is_released_and_one_greedy_flip_is_not_a_loss() -> None:
    report, _ = evaluate(LEARNED, GROUPS, SAMPLED)
    decision, why = decide(GateConfig(), report)
    assert decision == "released", why
    assert "5 task(s), 8 sampled answers each" in why
    assert "feedback 0/24 -> 21/24 [+" in why
    assert "correctness 9/16 -> 10/16" in why
    # The same candidate judged on one greedy answer loses `sum` (the old gate's verdict).
    greedy, _ = evaluate(LEARNED, GROUPS, GREEDY)
    decision, why = decide(GateConfig(), greedy)
    assert decision == "rejected" and "sum (1.00 -> 0.00)" in why


def test_a_candidate_without_a_feedback_gain_is_not_released_for_what_it_kept() -> None:
    kept: Passing = {
        name: (ALL, ALL) if name in ("sum", "capital") else ({1}, {2}) for name in GROUPS
    }
    report, _ = evaluate(kept, GROUPS, SAMPLED)
    assert report.candidate_mean == report.current_mean
    decision, why = decide(GateConfig(), report)
    assert decision == "rejected"
    assert (
        "group feedback does not improve by more than 0.000 beyond the noise (3/24 -> 3/24" in why
    )
    # A gain within the noise is no gain either: 1 sample of 24 more.
    noisy: Passing = kept | {"f0": ({1}, {1, 2})}
    decision, why = decide(GateConfig(), evaluate(noisy, GROUPS, SAMPLED)[0])
    assert decision == "rejected" and "(3/24 -> 4/24" in why


def test_a_consistent_loss_is_still_a_loss_and_small_losses_add_up() -> None:
    forgot: Passing = LEARNED | {"capital": (ALL, set())}
    decision, why = decide(GateConfig(), evaluate(forgot, GROUPS, SAMPLED)[0])
    assert decision == "rejected"
    assert (
        "lost 1 task(s) of group correctness against the best released: capital (8/8 -> 0/8)" in why
    )
    # Twelve tasks each one sample worse (7/8): none lost alone, the group is, beyond the noise.
    many = {f"c{n}": "correctness" for n in range(12)} | {f"f{n}": "feedback" for n in range(3)}
    slipped: Passing = {
        name: (ALL, ALL - {0}) if group == "correctness" else (set(), ALL)
        for name, group in many.items()
    }
    report, _ = evaluate(slipped, many, SAMPLED)
    assert not any(t.lost() for t in report.tasks if t.group == "correctness")
    decision, why = decide(GateConfig(), report)
    assert decision == "rejected"
    assert "group correctness falls below the bar against the best released beyond the noise" in why


def test_too_few_feedback_tasks_hold_the_candidate_for_a_human() -> None:
    two = {name: group for name, group in GROUPS.items() if name != "f2"}
    learned = {name: LEARNED[name] for name in two}
    decision, why = decide(GateConfig(), evaluate(learned, two, SAMPLED)[0])
    assert decision == "held"
    assert "only 2 feedback task(s) held out, and gate.min_feedback_tasks is 3" in why
    assert decide(GateConfig(min_feedback_tasks=2), evaluate(learned, two, SAMPLED)[0])[0] == (
        "released"
    )
    # A thin feedback group does not save a candidate that lost elsewhere.
    forgot = learned | {"capital": (ALL, set())}
    decision, why = decide(GateConfig(), evaluate(forgot, two, SAMPLED)[0])
    assert decision == "rejected" and "capital (8/8 -> 0/8)" in why


def calls(store: ExperienceStore, *requests: dict) -> None:
    for n, asked in enumerate(requests):
        body = {"messages": [{"role": "user", "content": f"q{n}"}], **asked}
        record = Record("default", body, {"choices": []}, engine="llamacpp", release_id="base")
        store.add_record(record).result()


def test_the_gate_samples_as_the_scenario_is_served(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path / "experience.db") as store:
        the_gate_samples_as_served(store)


def the_gate_samples_as_served(store: ExperienceStore) -> None:
    gate = GateConfig()
    # No call yet, or calls that set nothing: the engine's default temperature (sent unset).
    assert served_settings(store, "default", gate) == EvalSettings(None, 0, 256, SAMPLES)
    calls(store, {}, {"temperature": 0.7, "max_tokens": 64}, {"temperature": 0.7}, {})
    calls(
        store,
        {"temperature": 0.7, "max_tokens": 2000},
        {"temperature": 0.7, "max_completion_tokens": 3000},
    )
    settings = served_settings(store, "default", gate)
    assert (settings.temperature, settings.max_tokens) == (0.7, 256)  # at most gate.max_tokens
    assert served_settings(store, "default", GateConfig(max_tokens=5000)).max_tokens == 2000
    pinned = served_settings(store, "default", GateConfig(temperature=0.0))
    assert (pinned.temperature, pinned.answers_per_task) == (0.0, 1)  # greedy answers once


def test_a_greedy_release_s_score_is_no_bar_for_sampled_rates() -> None:
    """A chain released by the greedy gate holds `sum` at 1.0 (its one greedy answer passed);
    sampled, the same release passes it 1 time in 8. Held to 1.0, every sampled candidate would
    lose it: references count only from evaluations answered the same way."""
    result = {"task_id": "sum", "task_hash": "h", "current_score": 0.0}
    greedy = {"current_release_id": "base", "results": [{**result, "candidate_score": 1.0}]}
    sampled = {
        "current_release_id": "default@1",
        "sampling": {"temperature": None, "seed": 0, "max_tokens": 256, "samples": 8},
        "results": [{**result, "candidate_score": 0.125}],
    }
    chain = [("default@1", greedy), ("default@2", sampled)]
    assert best_released(chain, sampled=True)["sum#h"].score == 0.125
    assert best_released(chain, sampled=False)["sum#h"].score == 1.0
    assert best_released(chain)["sum#h"].score == 1.0  # unfiltered, as before
