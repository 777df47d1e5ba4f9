"""The one door to serving: every road by which a human makes a candidate serve asks the same
questions here, and writes the same words into the release when `force` overrides them.

The roads that pass through it (docs/releases.md has the whole table): `approve` (of a held or
proposed candidate, or of a canary: its promotion), a canary's start, and a regated candidate's
approval. The gate's own automatic release (`reef.releases.gate.decide`) is the other door: it
releases only what its rules passed, and a canary it starts is judged on live reports before it
is promoted. `rollback` and `promote` serve a release that served before; they take the admin
token over HTTP, as every road here does (`reef.server.auth.needs_admin`).

The questions:

- **Was this content evaluated, whole, against what it is built on?** A candidate without an
  evaluation (proposed and never gated, a regate interrupted, a gate that was cancelled) has no
  evidence that it does no harm.
- **Did the gate score it worse?** Its mean below the current release's, tasks it lost, or a
  routed arm that lost tasks or scored below the current release.

Either answer needs `force`; the release's reason then says what was overridden ("forced: it
lost 2 task(s): two-plus-three, ...").
"""

from __future__ import annotations

from typing import Any

from reef.errors import Conflict
from reef.store.candidates import Candidate


class GateScoredWorse(Conflict):
    """A human makes a candidate serve that the gate scored worse than what served, or never
    evaluated, without --force."""

    code = "gate_scored_worse"


def scored_worse(evaluation: dict[str, Any] | None) -> str | None:
    """What a candidate's gate evaluation says it loses against what served, in words (its
    mean below the current one's, tasks it lost, a routed arm that did either), or None when it
    lost nothing."""
    if not evaluation:
        return None
    said = _losses(evaluation.get("candidate_mean"), evaluation.get("current_mean"), evaluation)
    current = evaluation.get("current_mean")
    for arm in evaluation.get("arms") or []:
        if not isinstance(arm, dict):
            continue
        losses = _losses(arm.get("candidate_mean"), current, arm)
        said += [f"routed arm {arm.get('name')} ({arm.get('release')}) {s}" for s in losses]
    return " and ".join(said) or None


def _losses(candidate: object, current: object, found: dict[str, Any]) -> list[str]:
    said = []
    if (
        isinstance(candidate, int | float)
        and isinstance(current, int | float)
        and candidate < current
    ):
        said.append(f"scored {candidate:.3f} against the current {current:.3f}")
    lost = [str(task) for task in found.get("lost") or []]
    if lost:
        named = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        said.append(f"lost {len(lost)} task(s): {named}")
    return said


def unevaluated(candidate: Candidate) -> str | None:
    """Why the candidate has no complete evaluation against its base, or None when it has one."""
    evaluation = candidate.evaluation
    if not evaluation:
        return "was never evaluated"
    if not evaluation.get("tasks"):  # chat tasks and episodes alike
        return "was evaluated on no task"
    evaluated_against = evaluation.get("current_release_id")
    if evaluated_against is not None and evaluated_against != (candidate.base_release_id or "base"):
        return f"was evaluated against {evaluated_against}, not {candidate.base_release_id}"
    return None


def enter(candidate: Candidate, road: str, force: bool) -> str | None:
    """Let `candidate` through the door by `road` (a verb: "approve", "put on a canary"):
    None when nothing stands against it; with `force`, the words to add to the release's reason
    ("forced: it ..."); without, `GateScoredWorse` saying what it would override."""
    problems = (unevaluated(candidate), scored_worse(candidate.evaluation))
    said = " and ".join(problem for problem in problems if problem)
    if not said:
        return None
    if not force:
        raise GateScoredWorse(
            f"candidate {candidate.id} {said}: {road} it with --force (HTTP: "
            '"force": true) to make it serve anyway, or `reef release regate` it to evaluate '
            "it against the head"
        )
    return f"forced: it {said}"
