"""The gate's decision: release, reject or hold a candidate, given its paired evaluation.

The default policy, `no_regression`, releases a candidate that beats the current release on the
mean of its tasks *and* keeps every group's rule: by default no task may be lost, so a candidate
that wins a user's preference by forgetting how to answer (three preference tasks won, two
correctness tasks lost) is refused, and the decision names what it lost. `improve` compares the
means alone.

Whatever the policy, a candidate that has collapsed, one answer (the same content words) to
every task where the current release gives several, is rejected first, saying so: a LoRA
trained on one preference can end up answering "Sure! Sure!" to everything.
"""

from __future__ import annotations

from typing import Literal

from reef.config import GateConfig, GroupRule
from reef.evaluation.content import content_words
from reef.evaluation.runner import PairedReport, TaskResult

Decision = Literal["released", "rejected", "held", "canary"]
NAMED_LOSSES = 5  # lost tasks a decision names before it says "and N more"
COLLAPSE_TASKS = 3  # tasks a collapse needs to be seen


def decide(gate: GateConfig, report: PairedReport | None) -> tuple[Decision, str]:
    """The decision and a sentence saying why."""
    if gate.policy == "always":
        return "released", "gate policy is always: released without evaluation"
    if report is None:
        return "rejected", "no evaluation ran"
    current, candidate = report.current_mean, report.candidate_mean
    scores = f"candidate {candidate:.3f} vs current {current:.3f} on {len(report.tasks)} task(s)"
    collapse = collapsed(report)
    if collapse:
        return "rejected", f"{scores}; {collapse}"
    broken = broken_rules(gate, report)
    if gate.policy == "review":
        found = "".join(f"; {problem}" for problem in broken)
        return "held", f"{scores}{found}; gate policy is review: waiting for a human"
    if gate.policy in ("floor", "canary"):
        if candidate < gate.floor:
            return "rejected", f"{scores}; below the floor {gate.floor:.3f}"
        if gate.policy == "canary":
            share = gate.canary.share
            return "canary", f"{scores}; meets the floor {gate.floor:.3f}: a canary on {share}%"
        return "released", f"{scores}; meets the floor {gate.floor:.3f}"
    if gate.policy == "no_regression" and broken:
        return "rejected", f"{scores}; " + "; ".join(broken)
    if candidate > current + gate.margin:
        kept = ", and keeps every group's rule" if gate.policy == "no_regression" else ""
        return (
            "released",
            f"{scores}; beats current by more than the margin {gate.margin:.3f}{kept}",
        )
    return "rejected", f"{scores}; does not beat current by more than the margin {gate.margin:.3f}"


def collapsed(report: PairedReport) -> str | None:
    """Why the candidate has collapsed onto one answer, or None: of at least `COLLAPSE_TASKS`
    tasks, it says at most one thing per four tasks (by content words), while the current
    release says more."""
    if len(report.tasks) < COLLAPSE_TASKS:
        return None
    allowed = max(1, len(report.tasks) // 4)
    said = {frozenset(content_words(t.candidate_answer)) for t in report.tasks}
    before = {frozenset(content_words(t.current_answer)) for t in report.tasks}
    if len(said) > allowed or len(before) <= len(said):
        return None
    example = next(t.candidate_answer for t in report.tasks)
    return (
        f"collapsed: {len(said)} distinct answer(s) to {len(report.tasks)} tasks (the current "
        f"release gives {len(before)}), e.g. {example[:80]!r}"
    )


def broken_rules(gate: GateConfig, report: PairedReport) -> list[str]:
    """What each group of tasks fails of its rule, in words (nothing when every group keeps it)."""
    problems = []
    for name, group in report.groups().items():
        problem = _broken(name, group, gate.rule_for(name))
        if problem:
            problems.append(problem)
    return problems


def _broken(name: str, group: PairedReport, rule: GroupRule) -> str | None:
    if rule.rule == "keep":
        lost = [task for task in group.tasks if task.lost(rule.margin)]
        if len(lost) > rule.max_lost:
            allowed = f" (at most {rule.max_lost} may be)" if rule.max_lost else ""
            return f"lost {len(lost)} task(s) of group {name}{allowed}: {_named(lost)}"
    elif rule.rule == "improve":
        if group.candidate_mean <= group.current_mean + rule.margin:
            return (
                f"group {name} does not improve by more than {rule.margin:.3f} "
                f"({group.candidate_mean:.3f} vs {group.current_mean:.3f})"
            )
    elif rule.rule == "floor" and group.candidate_mean < rule.floor:
        return f"group {name} is below its floor {rule.floor:.3f} ({group.candidate_mean:.3f})"
    return None


def _named(lost: list[TaskResult]) -> str:
    named = ", ".join(
        f"{t.task_id} ({t.current_score:.2f} -> {t.candidate_score:.2f})"
        for t in lost[:NAMED_LOSSES]
    )
    more = len(lost) - NAMED_LOSSES
    return f"{named} and {more} more" if more > 0 else named
