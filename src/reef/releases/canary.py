"""A canary: a candidate serves a share of sessions, and their reports decide its release.

Starting one publishes a release holding the candidate's files and a routing policy
(`reef.releases.routing.canary_policy`): `share` percent of sessions on the release's own parts
(arm `canary`), the rest on the release that served before (arm `stable`). Every record says
which arm served it (`routing_release_id`, `arm`), so both arms are judged over the same period.

The test is a posterior on the difference of the arms' mean report scores, d = canary - stable:
with flat priors and each arm's mean approximately normal (its sample mean and variance over
`n` reports), d ~ Normal(mean_c - mean_s, var_c / n_c + var_s / n_s). Once each arm has
`min_reports` reports:

- **rollback** when P(d < -margin) >= confidence: the canary is worse by more than the margin;
- **promote** when P(d >= -margin) >= confidence: it is not worse by more than the margin;
- otherwise wait, until `deadline_s` after the canary started, when `on_deadline` decides.

A posterior may be looked at after every report without the error growing as a repeated
significance test's does; what it assumes is scores that are roughly normal in the mean (true
of 0/1 scores past a few dozen reports). Ending a canary publishes again: the candidate's files
without the policy (promote), or the stable release's files (rollback).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from reef.config import CanaryConfig
from reef.store import ExperienceStore

CANARY_ARM = "canary"
STABLE_ARM = "stable"
Action = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True)
class ArmScores:
    reports: int
    mean: float | None
    variance: float

    @classmethod
    def of(cls, scores: list[float]) -> ArmScores:
        if not scores:
            return cls(0, None, 0.0)
        variance = statistics.variance(scores) if len(scores) > 1 else 0.0
        return cls(len(scores), statistics.fmean(scores), variance)


@dataclass(frozen=True)
class Verdict:
    action: Action
    why: str
    stable: ArmScores
    canary: ArmScores
    difference: float | None = None  # the posterior mean of canary - stable
    interval: tuple[float, float] | None = None  # its central `confidence` interval
    p_worse: float | None = None  # P(canary worse by more than the margin)

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "why": self.why,
            "stable": vars(self.stable),
            "canary": vars(self.canary),
            "difference": self.difference,
            "interval": list(self.interval) if self.interval else None,
            "p_worse": self.p_worse,
        }


def arm_scores(store: ExperienceStore, routing_release_id: str) -> dict[str, list[float]]:
    """Each arm's report scores on the records its policy routed (one per record reported)."""
    rows = store.query(
        "SELECT r.arm AS arm, p.score AS score FROM records r "
        "JOIN report_references rr ON rr.record_id = r.id "
        "JOIN reports p ON p.id = rr.report_id "
        "WHERE r.routing_release_id = ? AND p.score IS NOT NULL",
        [routing_release_id],
    )
    scores: dict[str, list[float]] = {STABLE_ARM: [], CANARY_ARM: []}
    for row in rows:
        scores.setdefault(row["arm"], []).append(float(row["score"]))
    return scores


def judge(settings: CanaryConfig, scores: dict[str, list[float]], age_s: float) -> Verdict:
    """What to do with a canary that has run `age_s` seconds and has these reports."""
    stable = ArmScores.of(scores.get(STABLE_ARM, []))
    canary = ArmScores.of(scores.get(CANARY_ARM, []))
    enough = min(stable.reports, canary.reports) >= settings.min_reports
    if not enough or stable.mean is None or canary.mean is None:
        counts = f"{canary.reports} canary and {stable.reports} stable report(s)"
        if age_s >= settings.deadline_s:
            why = f"deadline ({settings.deadline_s:.0f} s) with {counts}: {settings.on_deadline}"
            return Verdict(settings.on_deadline, why, stable, canary)
        return Verdict("wait", f"{counts}, {settings.min_reports} each needed", stable, canary)
    difference = canary.mean - stable.mean
    spread = math.sqrt(canary.variance / canary.reports + stable.variance / stable.reports)
    p_worse = _probability_below(-settings.margin, difference, spread)
    half = statistics.NormalDist().inv_cdf((1 + settings.confidence) / 2) * spread
    interval = (difference - half, difference + half)
    figures = (
        f"canary {canary.mean:.3f} ({canary.reports}) vs stable {stable.mean:.3f} "
        f"({stable.reports}): difference {difference:+.3f}, "
        f"{settings.confidence:.0%} interval {interval[0]:+.3f} to {interval[1]:+.3f}, "
        f"P(worse by more than {settings.margin}) = {p_worse:.3f}"
    )
    action: Action
    if p_worse >= settings.confidence:
        action, why = "rollback", f"{figures}: worse, rolled back"
    elif 1 - p_worse >= settings.confidence:
        action, why = "promote", f"{figures}: not worse, promoted"
    elif age_s >= settings.deadline_s:
        action, why = settings.on_deadline, f"{figures}: undecided at the deadline"
    else:
        action, why = "wait", f"{figures}: undecided"
    return Verdict(action, why, stable, canary, difference, interval, p_worse)


def _probability_below(threshold: float, mean: float, spread: float) -> float:
    if spread == 0:
        return 1.0 if mean < threshold else 0.0
    return statistics.NormalDist(mean, spread).cdf(threshold)
