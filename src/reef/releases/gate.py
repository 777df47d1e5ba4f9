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

The gate answers each task as it is served, several times (`gate.samples`, at the serving
temperature, `reef.evaluation.runner`), so a rule reads rates, never one answer: `keep` is
broken when a task, or the group's samples together, fall below the bar beyond the noise (a
one-sided 95% bound, `reef.evaluation.intervals.worse_beyond_noise`); `improve` needs a gain
beyond the noise (the 95% interval of the change above the margin). A greedy gate (temperature
0) answers once, and a flipped answer is then a loss: greedy is what serves.

The `feedback` group (a recipe's held-out calls, scored by its scorer, or judged in the users'
words where it has none) must improve unless
`gate.groups` says otherwise: a candidate that moved nothing the users asked for is not
released for keeping the rest; with fewer than `gate.min_feedback_tasks` feedback tasks the
evidence is too thin to decide, and the candidate is held for a human. So is it when the tasks
are the users' words judged by a model (`reef.evaluation.judge`, where the recipe has no scorer)
and that judge refused fewer than `gate.judge_agreement` of the answers users failed: its
verdicts cannot decide. Every decision ends with
each group's samples passed, current then candidate, and a 95% interval of the change
(Newcombe's, `reef.evaluation.intervals.change_interval`): "feedback 0/24 -> 21/24 [+64%, +96%]"
says how thin the evidence is.
"""

from __future__ import annotations

from typing import Literal

from reef.config import GateConfig, GroupRule
from reef.evaluation.content import content_words
from reef.evaluation.intervals import change_interval, gain_beyond_noise, worse_beyond_noise
from reef.evaluation.runner import PairedReport, RoutedArm, TaskResult
from reef.evaluation.tasks import FEEDBACK_GROUP

Decision = Literal["released", "rejected", "held", "canary"]
NAMED_LOSSES = 5  # lost tasks a decision names before it says "and N more"
COLLAPSE_TASKS = 3  # tasks a collapse needs to be seen
AGAINST = "against the best released"  # what a lost task is counted against
STRONGER_JUDGE = "set a teacher or learning.proposer_url to a stronger model, or a scorer"


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
    scores = f"candidate {candidate:.3f} vs current {current:.3f} on {_tasks_said(report)}"
    collapse = collapsed(report)
    if collapse:
        return "rejected", f"{scores}; {collapse}"
    arms_broken = broken_arms(gate, report)
    thin = thin_feedback(gate, report) or untrusted_judge(gate, report)
    if thin and gate.policy != "review":  # the feedback does not decide: the rest still must keep
        others = broken_rules(gate, report, skip=FEEDBACK_GROUP) + arms_broken
        if others:
            return "rejected", f"{scores}; " + "; ".join(others)
        return "held", f"{scores}; {thin}: waiting for a human"
    broken = broken_rules(gate, report) + arms_broken
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


def _tasks_said(report: PairedReport) -> str:
    tasks = f"{len(report.tasks)} task(s)"
    if not report.sampled:
        return tasks
    most = max(t.samples for t in report.tasks)
    return f"{tasks}, {most} sampled answers each"


def thin_feedback(gate: GateConfig, report: PairedReport) -> str | None:
    """Why the feedback group is too thin to decide on, or None (no feedback group: the
    candidate's recipe learned from no scored feedback, or none was held out; or a group that
    `gate.groups` does not require to improve: it does not decide)."""
    feedback = [t for t in report.tasks if t.group == FEEDBACK_GROUP]
    if not feedback or len(feedback) >= gate.min_feedback_tasks:
        return None
    if gate.rule_for(FEEDBACK_GROUP).rule != "improve":
        return None
    return (
        f"only {len(feedback)} feedback task(s) held out, and gate.min_feedback_tasks is "
        f"{gate.min_feedback_tasks}: too few to tell a gain from noise (more scored calls, or "
        "a lower gate.min_feedback_tasks)"
    )


def untrusted_judge(gate: GateConfig, report: PairedReport) -> str | None:
    """Why the judge of plain words cannot decide the feedback group, or None: asked about the
    answers users failed, it refused fewer than `gate.judge_agreement` of them (a judge that
    passes what users failed would pass a candidate that changed nothing). A judge never
    measured (eval-file tasks written in plain words, no failed answer given) decides."""
    judge = report.judge
    if judge is None or not judge.asked or judge.share() >= gate.judge_agreement:
        return None
    if gate.rule_for(FEEDBACK_GROUP).rule != "improve":
        return None
    return (
        f"the feedback is {judge.said()}, below gate.judge_agreement {gate.judge_agreement:.0%}: "
        f"its verdicts on plain words are not trusted ({STRONGER_JUDGE})"
    )


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


def broken_rules(gate: GateConfig, report: PairedReport, skip: str | None = None) -> list[str]:
    """What each group of tasks (but `skip`) fails of its rule, in words (nothing when every
    group keeps it)."""
    problems = []
    for name, group in report.groups().items():
        problem = None if name == skip else _broken(name, group, gate.rule_for(name))
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
    before, after, count = group.current_passes, group.candidate_passes, group.answered
    if worse_beyond_noise(before, after, count, rule.margin):
        return (
            f"group {name} falls below the current release's by more than {rule.margin:.3f}, "
            f"beyond the noise ({_change(before, after, count)})"
        )
    return None


def _broken(name: str, group: PairedReport, rule: GroupRule) -> str | None:
    if rule.rule == "keep":
        lost = [task for task in group.tasks if task.lost(rule.margin)]
        if len(lost) > rule.max_lost:
            allowed = f" (at most {rule.max_lost} may be)" if rule.max_lost else ""
            return f"lost {len(lost)} task(s) of group {name} {AGAINST}{allowed}: {_named(lost)}"
        # Small losses no task shows alone, added up over the tasks not counted lost.
        rest = PairedReport(group.current_release_id, [t for t in group.tasks if t not in lost])
        bar, after, count = rest.bar_passes, rest.candidate_passes, rest.answered
        if rest.sampled and worse_beyond_noise(bar, after, count, rule.margin):
            return (
                f"group {name} falls below the bar {AGAINST} beyond the noise over the tasks "
                f"not lost alone ({_change(bar, after, count)})"
            )
    elif rule.rule == "improve":
        before, after, count = group.current_passes, group.candidate_passes, group.answered
        if not gain_beyond_noise(before, after, count, rule.margin):
            return (
                f"group {name} does not improve by more than {rule.margin:.3f} beyond the "
                f"noise ({_change(before, after, count)})"
            )
    elif rule.rule == "floor" and group.candidate_mean < rule.floor:
        return f"group {name} is below its floor {rule.floor:.3f} ({group.candidate_mean:.3f})"
    return None


def _named(lost: list[TaskResult]) -> str:
    named = ", ".join(f"{t.task_id} ({_task_change(t)})" for t in lost[:NAMED_LOSSES])
    more = len(lost) - NAMED_LOSSES
    return f"{named} and {more} more" if more > 0 else named


def _task_change(task: TaskResult) -> str:
    if task.samples == 1:
        return f"{task.bar:.2f} -> {task.candidate_score:.2f}"
    return f"{_count(task.bar_passes)}/{task.samples} -> {task.candidate_passes}/{task.samples}"


def _count(passes: float) -> str:
    return f"{passes:g}" if passes == int(passes) else f"{passes:.1f}"


def _change(before: float, after: float, count: int) -> str:
    """`before/count -> after/count [low, high]`: the 95% interval of the change."""
    low, high = change_interval(before, after, count)
    return f"{_count(before)}/{count} -> {_count(after)}/{count} [{low:+.0%}, {high:+.0%}]"


def groups_said(report: PairedReport) -> str:
    """Each group's samples passed, current -> candidate, with a 95% interval of the change."""
    said = [
        f"{name} {_change(group.current_passes, group.candidate_passes, group.answered)}"
        for name, group in sorted(report.groups().items())
    ]
    return "groups: " + ", ".join(said) + _judge_said(report)


def _judge_said(report: PairedReport) -> str:
    """Who judged the plain words, how far it agrees with the users, and, where it passed no
    answer of either side, that it may not see a gain at all: a judge that says no to
    everything refuses what users failed too (the embedded model does)."""
    judge = report.judge
    if judge is None:
        return ""
    blind = (
        f"; it passed none of the {judge.answers} answers of either side and may not see a gain "
        f"({STRONGER_JUDGE})"
        if judge.blind
        else ""
    )
    return f"; feedback {judge.said()}{blind}"
