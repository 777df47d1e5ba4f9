"""A canary: a candidate serves a share of sessions, and their reports decide its release.

Starting one publishes a release holding the candidate's files and a routing policy
(`reef.inference.routing.canary_policy`): `share` percent of sessions on the release's own parts
(arm `canary`), the rest on the release that served before (arm `stable`). Every record says
which arm served it (`routing_release_id`, `arm`), so both arms are judged over the same period.

What is counted (`arm_scores`): each session once, as the mean of its scores, so that no client
weighs more than its sessions. A report counts once, toward the first record it references that
the canary routed, however many records it names; a report on a call without a session is a
session of its own. Scores lie in `score_range` (the report route refuses others on a canary's
records). A call the teacher took over because the student's answer failed its check
(`failed_arm`) counts as that arm's worst score, the range's low end: the teacher's answer
would otherwise hide the arm's failures.

The test is a confidence sequence for the difference of the arms' mean scores, d = canary -
stable: an interval that holds d at every look at once with probability `confidence`, so the
judge may look after every report without its errors growing. It is the two-sided normal
mixture boundary of Robbins (1970), in the closed form of Howard, Ramdas, McAuliffe and Sekhon,
"Time-uniform, nonparametric, nonasymptotic confidence sequences" (Annals of Statistics 2021),
applied to the difference of two means as Johari, Koomen, Pekelis and Walsh's mSPRT
does ("Always valid inference: continuous monitoring of A/B tests", Operations Research 2022):
with I = 1 / (var_c / n_c + var_s / n_s), the information the reports hold about d,

    d in  mean_c - mean_s  +-  sqrt((I + rho) * log((I + rho) / (rho * alpha^2))) / I,

alpha = 1 - confidence. Where ours differs: the mSPRT pairs one report of each arm per step;
here the arms have any sizes (the sum I * (estimate - d) is a Brownian motion in I however the
reports split, as long as the split does not depend on the scores: it follows the session's
hash). The variances are estimated, not known, so the guarantee is asymptotic (Waudby-Smith et
al., "Time-uniform central limit theory and asymptotic confidence sequences", Annals of
Statistics 2024), and each arm's variance has a prior: its scores as if it had also seen the
two ends of the range once, so that arms whose scores have not varied yet are not read as
certain. The mixture's precision rho makes the interval narrowest where its half-width is the
margin. Simulated with this judge after every report (tests/releases/test_canary_statistics.py,
figures in docs/releases.md), a canary worse by exactly the margin is promoted in 2% of
canaries on 0/1 scores at the defaults, under the 5% the confidence allows (a fixed-sample rule
looked at as often: 27%). Once each arm has `min_reports` sessions:

- **rollback** when the whole interval lies below -margin: the canary is worse by more;
- **promote** when it lies above -margin: the canary is not worse by more than the margin;
- otherwise wait, until `deadline_s` after the canary started, when `on_deadline` decides.

Ending a canary publishes again: the candidate's files without the policy (promote), or the
stable release's files (rollback). `Canaries` starts and ends them, for the release workflow (a
human's decision, or the gate's `canary` outcome) and for the server's judge.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reef.artifacts import ROUTING_FILE
from reef.config import CanaryConfig
from reef.errors import Conflict, ReefError
from reef.inference.routing import BASE, canary_policy
from reef.releases.chain import ReleaseChain, ReleaseConflict, read_folder
from reef.store import ExperienceStore
from reef.store.candidates import Candidate, CandidateStore
from reef.store.routed import arm_reports, taken_over

CANARY_ARM = "canary"
STABLE_ARM = "stable"
ARMS = (STABLE_ARM, CANARY_ARM)
Action = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True)
class ArmScores:
    """One arm's scores: how many (sessions, each counted once), their mean and variance."""

    reports: int
    mean: float | None
    variance: float  # the sample variance of the scores, without the prior

    @classmethod
    def of(cls, scores: Sequence[float]) -> ArmScores:
        if not scores:
            return cls(0, None, 0.0)
        mean = math.fsum(scores) / len(scores)
        squares = math.fsum((score - mean) ** 2 for score in scores)
        return cls(len(scores), mean, squares / (len(scores) - 1) if len(scores) > 1 else 0.0)

    def adding(self, score: float) -> ArmScores:
        """These scores and one more (Welford's update, so a running canary costs O(1))."""
        if self.mean is None:
            return ArmScores(1, score, 0.0)
        n = self.reports + 1
        mean = self.mean + (score - self.mean) / n
        squares = self.variance * (n - 2) + (score - self.mean) * (score - mean)
        return ArmScores(n, mean, squares / (n - 1))


@dataclass(frozen=True)
class Verdict:
    action: Action
    why: str
    stable: ArmScores
    canary: ArmScores
    difference: float | None = None  # the estimate of canary - stable
    interval: tuple[float, float] | None = None  # its `confidence` confidence sequence, now

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "why": self.why,
            "stable": vars(self.stable),
            "canary": vars(self.canary),
            "difference": self.difference,
            "interval": list(self.interval) if self.interval else None,
        }


def arm_scores(
    store: ExperienceStore, routing_release_id: str, score_range: tuple[float, float]
) -> dict[str, ArmScores]:
    """Each arm's scores on the records the policy of `routing_release_id` routed: a session's
    reports count once, as their mean; a teacher's takeover counts as the range's low end."""
    sessions: dict[tuple[str, str], list[float]] = defaultdict(list)
    for arm, session, score in arm_reports(store, routing_release_id, ARMS):
        sessions[arm, session].append(_within(score, score_range))
    for arm, session in taken_over(store, routing_release_id, ARMS):
        sessions[arm, session].append(score_range[0])
    means: dict[str, list[float]] = {STABLE_ARM: [], CANARY_ARM: []}
    for (arm, _), scores in sessions.items():
        means[arm].append(math.fsum(scores) / len(scores))
    return {arm: ArmScores.of(scores) for arm, scores in means.items()}


def _within(score: float, score_range: tuple[float, float]) -> float:
    # The report route refuses a score outside the range on a running canary's records; one
    # sent between the canary's publish and its candidate's move to `canary` was not checked.
    low, high = score_range
    return min(max(score, low), high)


def judge(
    settings: CanaryConfig, scores: Mapping[str, ArmScores | Sequence[float]], age_s: float
) -> Verdict:
    """What to do with a canary that has run `age_s` seconds and has these scores (each arm's
    `ArmScores`, or its scores)."""
    stable = _summary(scores.get(STABLE_ARM, ()))
    canary = _summary(scores.get(CANARY_ARM, ()))
    enough = min(stable.reports, canary.reports) >= settings.min_reports
    if not enough or stable.mean is None or canary.mean is None:
        counts = f"{canary.reports} canary and {stable.reports} stable session(s) scored"
        if age_s >= settings.deadline_s:
            why = f"deadline ({settings.deadline_s:.0f} s) with {counts}: {settings.on_deadline}"
            return Verdict(settings.on_deadline, why, stable, canary)
        return Verdict("wait", f"{counts}, {settings.min_reports} each needed", stable, canary)
    difference = canary.mean - stable.mean
    low, high = confidence_sequence(settings, stable, canary)
    figures = (
        f"canary {canary.mean:.3f} ({canary.reports}) vs stable {stable.mean:.3f} "
        f"({stable.reports}): difference {difference:+.3f}, "
        f"{settings.confidence:.0%} interval {low:+.3f} to {high:+.3f} (margin {settings.margin})"
    )
    action: Action
    if high < -settings.margin:
        action, why = "rollback", f"{figures}: worse, rolled back"
    elif low > -settings.margin:
        action, why = "promote", f"{figures}: not worse, promoted"
    elif age_s >= settings.deadline_s:
        action, why = settings.on_deadline, f"{figures}: undecided at the deadline"
    else:
        action, why = "wait", f"{figures}: undecided"
    return Verdict(action, why, stable, canary, difference, (low, high))


def confidence_sequence(
    settings: CanaryConfig, stable: ArmScores, canary: ArmScores
) -> tuple[float, float]:
    """The interval that holds canary - stable at every look with probability `confidence`."""
    assert stable.mean is not None and canary.mean is not None
    spread = (
        _prior_variance(canary, settings.score_range) / canary.reports
        + _prior_variance(stable, settings.score_range) / stable.reports
    )
    information = 1 / spread
    rho = _mixture_precision(settings)
    alpha = 1 - settings.confidence
    boundary = math.sqrt((information + rho) * math.log((information + rho) / (rho * alpha**2)))
    half = boundary / information
    difference = canary.mean - stable.mean
    return difference - half, difference + half


def _prior_variance(arm: ArmScores, score_range: tuple[float, float]) -> float:
    """The arm's variance with the range's two ends added to its scores: pooled (Chan et al.)
    with the pair {low, high}, whose mean is the middle and whose squared deviations sum to
    (high - low)^2 / 2."""
    assert arm.mean is not None
    low, high = score_range
    n = arm.reports
    squares = arm.variance * (n - 1) + (high - low) ** 2 / 2
    squares += (arm.mean - (low + high) / 2) ** 2 * n * 2 / (n + 2)
    return squares / (n + 1)


def _mixture_precision(settings: CanaryConfig) -> float:
    """rho that makes the interval narrowest where its half-width is the margin (a tenth of
    the score range with no margin)."""
    low, high = settings.score_range
    return _narrowest_at(settings.margin or (high - low) / 10, 1 - settings.confidence)


@functools.cache
def _narrowest_at(width: float, alpha: float) -> float:
    """rho whose boundary has half-width `width` where it is narrowest. Minimising the half-width
    at information I over rho gives rho = I / x, x solving x = L + log(1 + x) with L = -2
    log(alpha); the half-width there is sqrt((1 + x) / I), which is `width` at I = (1 + x) /
    width^2."""
    target = -2 * math.log(alpha)
    x = target
    for _ in range(100):  # a contraction (slope 1 / (1 + x) < 1/2): 1e-12 in a few dozen steps
        x = target + math.log1p(x)
    return (1 + x) / (x * width**2)


def _summary(scores: ArmScores | Sequence[float]) -> ArmScores:
    return scores if isinstance(scores, ArmScores) else ArmScores.of(scores)


# -- starting and ending a canary -----------------------------------------------------------------


# How the release workflow rejects a candidate (`ReleaseWorkflow._reject`): the candidate, the
# states it may be in, why, its evaluation, and whether it was judged on its merits (which says
# what becomes of the records it consumed).
Reject = Callable[[Candidate, tuple[str, ...], str, dict[str, Any] | None, bool], Candidate]
JUDGED, NOT_JUDGED = True, False


class Canaries:
    """Puts candidates on canaries and ends them, as publishes on the chain."""

    def __init__(self, chain: ReleaseChain, candidates: CandidateStore, reject: Reject) -> None:
        self.chain = chain
        self.candidates = candidates
        self.reject = reject

    def start(
        self,
        candidate_id: str,
        share: int,
        why: str | None = None,
        evaluation: dict[str, Any] | None = None,
        allowed_from: tuple[str, ...] = ("held", "proposed"),
    ) -> Candidate:
        """Put a candidate on `share` percent of its scenario's sessions: a release of its files
        and a policy routing the rest to the release it was proposed against. From the gate
        (`allowed_from` evaluating), a head that moved meanwhile rejects it."""
        candidate = self.candidates.get(candidate_id)
        _check_startable(candidate, share, allowed_from)
        stable = candidate.base_release_id or BASE
        files = {**read_folder(candidate.folder), ROUTING_FILE: canary_policy(stable, share)}
        why = why or "put on a canary by a human"
        try:
            release = self.chain.publish(
                candidate.scenario,
                candidate.kind,
                files,
                candidate.base_release_id,
                candidate_id=candidate.id,
                evaluation=evaluation or candidate.evaluation,
                reason=f"canary of {candidate.id} on {share}% of sessions, against {stable}",
            )
        except ReleaseConflict as conflict:
            if "evaluating" not in allowed_from:
                raise
            moved = f"{why}, but the head is now {conflict.current}: propose it again"
            return self.reject(candidate, allowed_from, moved, evaluation, NOT_JUDGED)
        return self.candidates.move(
            candidate.id,
            allowed_from,
            "canary",
            decision=f"{why} (canary {release.release_id}, {share}%)",
            evaluation=evaluation or candidate.evaluation,
            release_id=release.release_id,
        )

    def end(self, candidate_id: str, promote: bool, why: str) -> Candidate:
        """End a candidate's canary: promoted (its files, released without the policy) or rolled
        back (the stable release's files). A head that moved past the canary ended it already."""
        candidate = self.candidates.get(candidate_id)
        canary_release = candidate.release_id
        head = self.chain.head(candidate.scenario)
        if candidate.state != "canary" or canary_release is None:
            raise Conflict(
                f"candidate {candidate_id} is {candidate.state}, not on a canary",
                code="candidate_state",
            )
        if head is None or head.release_id != canary_release:
            now = head.release_id if head else "none"
            moved = f"its canary {canary_release} stopped serving: the head is now {now}"
            return self.reject(candidate, ("canary",), moved, candidate.evaluation, NOT_JUDGED)
        if promote:
            return self._promote(candidate, canary_release, why)
        return self._roll_back(candidate, canary_release, why)

    def _promote(self, candidate: Candidate, canary_release: str, why: str) -> Candidate:
        release = self.chain.publish(
            candidate.scenario,
            candidate.kind,
            read_folder(candidate.folder),
            canary_release,
            candidate_id=candidate.id,
            evaluation=candidate.evaluation,
            records_consumed=len(candidate.consumed_record_ids),
            reason=f"{candidate.reason} (canary: {why})" if candidate.reason else why,
        )
        return self.candidates.move(
            candidate.id, ("canary",), "released", decision=why, release_id=release.release_id
        )

    def _roll_back(self, candidate: Candidate, canary_release: str, why: str) -> Candidate:
        stable = candidate.base_release_id
        reason = f"canary of {candidate.id} rolled back: {why}"
        if stable is None:  # the model alone served before: an empty release serves it again
            self.chain.publish(candidate.scenario, "harness", {}, canary_release, reason=reason)
        else:
            self.chain.rollback(candidate.scenario, stable, reason, expected_head=canary_release)
        rolled_back = f"canary rolled back: {why}"
        return self.reject(candidate, ("canary",), rolled_back, candidate.evaluation, JUDGED)


def _check_startable(candidate: Candidate, share: int, allowed_from: tuple[str, ...]) -> None:
    if candidate.state not in allowed_from:
        raise Conflict(
            f"candidate {candidate.id} is {candidate.state}; only a candidate that is "
            f"{' or '.join(allowed_from)} can go on a canary",
            code="candidate_state",
        )
    if not 1 <= share <= 99:
        raise ReefError(f"a canary's share is 1 to 99 percent, not {share}", status=400)
