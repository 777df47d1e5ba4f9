"""The gate's decision: release, reject or hold a candidate, given its paired evaluation.

Every policy that can release (`no_regression`, `improve`, `floor`, `canary`) first holds each
group of tasks to its rule: by default no task may be lost, so a candidate that wins a user's
preference by forgetting how to answer (three preference tasks won, two correctness tasks lost) is
refused, and the decision names what it lost. A task is lost against the best score any released
release reached on it (`reef.evaluation.reference`), not the release just before: small losses
cannot add up along a chain. `improve` holds only the groups `gate.groups` names; the others
count in the mean alone. `review` holds the candidate for a human, naming any rule broken.

The releases a candidate's routing policy sends sessions to (its arms other than `self`) are
held to the same group rules, and may not score below the current release (under `floor` and
`canary`: below the floor): a policy that routes everyone to a worse release is refused.

Whatever the policy, a candidate that has collapsed, one answer (the same content words) to
every task where the current release gives several, is rejected first, saying so: a LoRA
trained on one preference can end up answering "Sure! Sure!" to everything.

The `feedback` group (a recipe's held-out calls, scored by its scorer) must improve unless
`gate.groups` says otherwise: a candidate that moved nothing the users asked for is not
released for keeping the rest. Every decision ends with each group's tasks passed, current then
candidate, and a 95% interval of the change (Newcombe's hybrid score interval for a difference
of two proportions, method 10 of "Two-sided confidence intervals for the single proportion",
Statistics in Medicine 1998; the tasks are paired, which this interval ignores, so it is wider
than a paired one): "feedback 0/3 -> 2/3 [-19%, +85%]" says how thin the evidence is.
"""

from __future__ import annotations

from typing import Literal

from reef.config import GateConfig, GroupRule
from reef.evaluation.content import content_words
from reef.evaluation.live import wilson
from reef.evaluation.runner import PairedReport, RoutedArm, TaskResult

Decision = Literal["released", "rejected", "held", "canary"]
NAMED_LOSSES = 5  # lost tasks a decision names before it says "and N more"
COLLAPSE_TASKS = 3  # tasks a collapse needs to be seen
AGAINST = "against the best released"  # what a lost task is counted against


def decide(gate: GateConfig, report: PairedReport | None) -> tuple[Decision, str]:
    """The decision and a sentence saying why."""
    if gate.policy == "always":
        return "released", "gate policy is always: released without evaluation"
    if report is None:
        return "rejected", "no evaluation ran"
    decision, why = _decide(gate, report)
    return decision, f"{why}; {groups_said(report)}" if report.tasks else why


def _decide(gate: GateConfig, report: PairedReport) -> tuple[Decision, str]:
    current, candidate = report.current_mean, report.candidate_mean
    scores = f"candidate {candidate:.3f} vs current {current:.3f} on {len(report.tasks)} task(s)"
    collapse = collapsed(report)
    if collapse:
        return "rejected", f"{scores}; {collapse}"
    broken = broken_rules(gate, report) + broken_arms(gate, report)
    if gate.policy == "review":
        found = "".join(f"; {problem}" for problem in broken)
        return "held", f"{scores}{found}; gate policy is review: waiting for a human"
    if broken:
        return "rejected", f"{scores}; " + "; ".join(broken)
    arms = "".join(f"; {kept}" for kept in kept_arms(report))
    if gate.policy in ("floor", "canary"):
        if candidate < gate.floor:
            return "rejected", f"{scores}; below the floor {gate.floor:.3f}"
        kept = f"meets the floor {gate.floor:.3f} and keeps every group's rule {AGAINST}{arms}"
        if gate.policy == "canary":
            return "canary", f"{scores}; {kept}: a canary on {gate.canary.share}%"
        return "released", f"{scores}; {kept}"
    if candidate > current + gate.margin:
        beats = f"beats current by more than the margin {gate.margin:.3f}"
        return "released", f"{scores}; {beats}{_groups_kept(gate)}{arms}"
    return "rejected", f"{scores}; does not beat current by more than the margin {gate.margin:.3f}"


def _groups_kept(gate: GateConfig) -> str:
    """What a released candidate kept of the group rules, as the decision says it."""
    if gate.policy != "improve":
        return f", and keeps every group's rule {AGAINST}"
    if gate.groups:
        return f", and keeps the rules of the groups gate.groups names {AGAINST}"
    return " (policy improve: the mean alone, no group named in gate.groups)"


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


def broken_arms(gate: GateConfig, report: PairedReport) -> list[str]:
    """What each routed arm fails, in words: the group rules as for the candidate (a group that
    must improve must only not fall below the current release: an arm may serve it), and a mean
    below the current release's by more than `margin` (under floor and canary: below the floor)."""
    problems = []
    for arm in report.arms:
        named = f"routed arm {arm.name} ({arm.release}, {arm.share}%)"
        problems += [f"{named}: {problem}" for problem in _arm_problems(gate, arm)]
    return problems


def kept_arms(report: PairedReport) -> list[str]:
    """The routed arms, each said to keep the rules (when `broken_arms` found nothing)."""
    return [
        f"routed arm {arm.name} ({arm.release}, {arm.share}%) keeps the rules "
        f"({arm.report.candidate_mean:.3f})"
        for arm in report.arms
    ]


def _arm_problems(gate: GateConfig, arm: RoutedArm) -> list[str]:
    problems = []
    for name, group in arm.report.groups().items():
        rule = gate.rule_for(name)
        problem = _fell(name, group, rule) if rule.rule == "improve" else _broken(name, group, rule)
        if problem:
            problems.append(problem)
    mean, current = arm.report.candidate_mean, arm.report.current_mean
    if gate.policy in ("floor", "canary"):
        if mean < gate.floor:
            problems.append(f"below the floor {gate.floor:.3f} ({mean:.3f})")
    elif mean < current - gate.margin:
        problems.append(f"scores {mean:.3f}, below the current release's {current:.3f}")
    return problems


def _fell(name: str, group: PairedReport, rule: GroupRule) -> str | None:
    if group.candidate_mean < group.current_mean - rule.margin:
        return (
            f"group {name} falls below the current release's by more than {rule.margin:.3f} "
            f"({group.candidate_mean:.3f} vs {group.current_mean:.3f})"
        )
    return None


def _broken(name: str, group: PairedReport, rule: GroupRule) -> str | None:
    if rule.rule == "keep":
        lost = [task for task in group.tasks if task.lost(rule.margin)]
        if len(lost) > rule.max_lost:
            allowed = f" (at most {rule.max_lost} may be)" if rule.max_lost else ""
            return f"lost {len(lost)} task(s) of group {name} {AGAINST}{allowed}: {_named(lost)}"
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
        f"{t.task_id} ({t.bar:.2f} -> {t.candidate_score:.2f})" for t in lost[:NAMED_LOSSES]
    )
    more = len(lost) - NAMED_LOSSES
    return f"{named} and {more} more" if more > 0 else named


PASS = 0.5  # a task's score at which it counts as passed in the groups' counts
Z95 = 1.959963984540054


def groups_said(report: PairedReport) -> str:
    """Each group's tasks passed, current -> candidate, with a 95% interval of the change."""
    said = []
    for name, group in sorted(report.groups().items()):
        count = len(group.tasks)
        before = sum(task.current_score >= PASS for task in group.tasks)
        after = sum(task.candidate_score >= PASS for task in group.tasks)
        low, high = change_interval(before, after, count)
        said.append(f"{name} {before}/{count} -> {after}/{count} [{low:+.0%}, {high:+.0%}]")
    return "groups: " + ", ".join(said)


def change_interval(before: int, after: int, count: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval (95%) of after/count - before/count."""
    if count == 0:
        return -1.0, 1.0
    p1, p2 = after / count, before / count
    l1, u1 = wilson(after, count, Z95)
    l2, u2 = wilson(before, count, Z95)
    difference = p1 - p2
    low = difference - ((p1 - l1) ** 2 + (u2 - p2) ** 2) ** 0.5
    high = difference + ((u1 - p1) ** 2 + (p2 - l2) ** 2) ** 0.5
    return max(-1.0, low), min(1.0, high)
