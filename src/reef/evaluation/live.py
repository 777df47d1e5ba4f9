"""Is it learning? Each release's pass rate on the live traffic it served, with its uncertainty.

The gate says whether a candidate beat what served on tasks; a user wants to know whether the
release helps on their own traffic. Per scenario and per release, from the calls that release
answered (every record names the release that produced it, so a release's calls are exactly
those since it began serving, until the next one did):

- `reports`: the calls users scored, a call passing when its reports' mean score is at or above
  the gate's `replay_threshold` (0.5: a 1/0 score's pass);
- `scorer`: where the scenario's recipe has a scorer a program runs (not a judge model), the
  share of all the calls it answered that the scorer accepts, scored or not;

each as a count, a rate and its 95% Wilson interval, so that 2 of 6 is read as the wide guess it
is. Only what the release's own model answered passes: a call the scenario's teacher took over
is the student's failure, however well the teacher answered, and a record imported from
elsewhere (`POST /reef/records/batch`) counts for no release, whatever `release_id` it says.
The base model's row ("base") is what served before any release: the same users, earlier.
With `gate.shadow.base_share`, the base also answers a share of each release's calls as a shadow
(`reef.daemon.shadow`, never heard): `base_shadow` is its pass rate on those very calls and
`shadowed` the release's own on them, both by the recipe's scorer: the same stream, side by side.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Any

from reef.config import ReefConfig
from reef.evaluation.intervals import wilson
from reef.evaluation.replay import trains
from reef.evaluation.scorers import program_scorer, score
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec
from reef.protocol import response_text
from reef.store import ExperienceStore
from reef.store.learning import calls_fingerprint
from reef.store.shadows import shadow_scores_by_release

IMPORTED = "import"  # a record's engine when `POST /reef/records/batch` stored it
TEACHER_ARM = "teacher"  # a record's arm when the scenario's teacher answered it

# Scorers a program runs on each live answer (a judge would ask a model per call).
LIVE_SCORERS = ("exact", "contains", "regex", "python")
PROGRESS_CALLS = 2000  # the newest calls of a scenario its progress is read from
BASE_SHADOW = "base"  # the candidate id of the base model's shadow answers (`reef.daemon.shadow`)


@dataclass(frozen=True)
class PassRate:
    passed: int
    count: int

    @property
    def rate(self) -> float | None:
        return self.passed / self.count if self.count else None

    def to_json(self) -> dict[str, Any]:
        low, high = wilson(self.passed, self.count)
        rate = self.rate
        return {
            "passed": self.passed,
            "count": self.count,
            "rate": None if rate is None else round(rate, 4),
            "low": round(low, 4),
            "high": round(high, 4),
        }

    def said(self) -> str:
        """"2/6 33% [10%-70%]", or "-" with no calls."""
        if not self.count:
            return "-"
        low, high = wilson(self.passed, self.count)
        return f"{self.passed}/{self.count} {self.passed / self.count:.0%} [{low:.0%}-{high:.0%}]"


def said(found: dict[str, Any] | None) -> str:
    """A pass rate as `PassRate.to_json` wrote it, said: "2/6 33% [10%-70%]", or "-"."""
    return PassRate(int(found["passed"]), int(found["count"])).said() if found else "-"


def gate_estimate(evaluation: dict[str, Any] | None) -> PassRate | None:
    """What the gate measured of a release on the feedback users asked for: its samples passed
    on the `feedback` group (held-out scored calls), or None (no such group, or an evaluation
    from before the gate counted samples)."""
    groups = (evaluation or {}).get("groups") or {}
    feedback = groups.get(FEEDBACK_GROUP) if isinstance(groups, dict) else None
    if not isinstance(feedback, dict) or not feedback.get("answered"):
        return None
    return PassRate(int(feedback["candidate_passes"]), int(feedback["answered"]))


def below_gate(gate: PassRate | None, live: PassRate | None) -> str | None:
    """Said when a release's live rate lies below the gate's prediction beyond both intervals
    ("gate predicted 55% [40%-70%], live 4% [1%-19%]"), else None."""
    if gate is None or live is None or not gate.count or not live.count:
        return None
    if wilson(live.passed, live.count)[1] >= wilson(gate.passed, gate.count)[0]:
        return None
    return f"gate predicted {_rate(gate)}, live {_rate(live)}"


def against_gate(evaluation: dict[str, Any] | None, release: ReleaseProgress) -> dict[str, Any]:
    """The gate's estimate of a release on the feedback group (`gate`, from its `evaluation`)
    beside its live rate (the recipe's scorer on every call it answered, else users' reports),
    and, when live falls below it beyond both intervals, a sentence saying so (`below_gate`)."""
    gate = gate_estimate(evaluation)
    live = release.scorer if release.scorer and release.scorer.count else release.reports
    return {"gate": gate.to_json() if gate else None, "below_gate": below_gate(gate, live)}


def _rate(found: PassRate) -> str:
    low, high = wilson(found.passed, found.count)
    return f"{found.passed / found.count:.0%} [{low:.0%}-{high:.0%}]"


def beside_base(release: dict[str, Any]) -> str:
    """A release's pass rate on the calls the base shadowed beside the base's (its JSON), or
    "-" where the base shadowed none."""
    if not release.get("base_shadow"):
        return "-"
    return f"{said(release['shadowed'])} vs base {said(release['base_shadow'])}"


@dataclass(frozen=True)
class ReleaseProgress:
    release_id: str
    served: int  # calls it answered (of the newest looked at)
    first_at: float  # when it first answered one
    reports: PassRate
    scorer: PassRate | None
    # On the calls the base shadowed: the release's own answers and the base's, by the scorer.
    shadowed: PassRate | None = None
    base_shadow: PassRate | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "served": self.served,
            "first_at": self.first_at,
            "reports": self.reports.to_json(),
            "scorer": self.scorer.to_json() if self.scorer else None,
            "shadowed": self.shadowed.to_json() if self.shadowed else None,
            "base_shadow": self.base_shadow.to_json() if self.base_shadow else None,
        }


# The last figures read, by store, scenario and settings, with the calls' fingerprint they were
# read at: the review TUI asks every second and `/metrics` at every scrape, and a scenario's
# 2,000 newest calls decoded and scored cost tens of milliseconds, for the same figures until a
# call, a report or a shadow answer arrives.
_READ: dict[tuple[Any, ...], tuple[tuple[Any, ...], list[ReleaseProgress]]] = {}
_READ_LOCK = threading.Lock()
_READ_KEPT = 64


def live_progress(
    store: ExperienceStore,
    scenario: str,
    threshold: float,
    scorer: ScorerSpec | None = None,
    limit: int = PROGRESS_CALLS,
) -> list[ReleaseProgress]:
    """Each release's pass rates on the newest `limit` calls of `scenario`, in the order the
    releases began serving (base first); read again only once the scenario's calls changed."""
    key = (store.name, scenario, threshold, scorer.model_dump_json() if scorer else None, limit)
    seen = calls_fingerprint(store, scenario)
    with _READ_LOCK:
        kept = _READ.get(key)
    if kept is not None and kept[0] == seen:
        return list(kept[1])  # a caller's list of its own: what is kept stays as it was read
    progress = read_progress(store, scenario, threshold, scorer, limit)
    with _READ_LOCK:
        if len(_READ) >= _READ_KEPT:
            _READ.pop(next(iter(_READ)))
        _READ[key] = (seen, progress)
    return list(progress)


def read_progress(
    store: ExperienceStore,
    scenario: str,
    threshold: float,
    scorer: ScorerSpec | None,
    limit: int,
) -> list[ReleaseProgress]:
    """`live_progress`, read in full every time (nothing kept)."""
    judged = scorer if scorer is not None and scorer.type in LIVE_SCORERS else None
    calls: dict[str, list[dict[str, Any]]] = {}
    for call in store.latest_records(scenario, limit):
        if call.get("engine") == IMPORTED:
            continue  # made elsewhere: no release of this chain answered it
        calls.setdefault(call["release_id"], []).append(call)
    shadowed = _base_shadowed(store, scenario, limit)
    progress = [
        _release_progress(release, found, threshold, judged, shadowed.get(release))
        for release, found in calls.items()
    ]
    return sorted(progress, key=lambda p: (p.release_id != "base", p.first_at))


def _base_shadowed(
    store: ExperienceStore, scenario: str, limit: int
) -> dict[str, tuple[PassRate, PassRate]]:
    """Per release, on the calls the base shadowed: its answers' pass rate and the base's."""
    pairs: dict[str, list[tuple[float | None, float]]] = {}
    for row in shadow_scores_by_release(store, scenario, BASE_SHADOW, limit):
        pairs.setdefault(row["release_id"], []).append((row["live_score"], row["shadow_score"]))
    return {
        release: (
            PassRate(sum((live or 0.0) >= 0.5 for live, _ in found), len(found)),
            PassRate(sum(base >= 0.5 for _, base in found), len(found)),
        )
        for release, found in pairs.items()
    }


def _release_progress(
    release_id: str,
    calls: list[dict[str, Any]],
    threshold: float,
    scorer: ScorerSpec | None,
    shadow: tuple[PassRate, PassRate] | None,
) -> ReleaseProgress:
    scored = [(call, scores) for call in calls if (scores := _scores(call))]
    passed = sum(_own(call) and statistics.fmean(s) >= threshold for call, s in scored)
    reports = PassRate(passed, len(scored))
    accepted = None
    if scorer is not None:
        accepted = PassRate(sum(_own(c) and _accepts(scorer, c) for c in calls), len(calls))
    first = min(call["created_at"] for call in calls)
    shadowed, base = shadow or (None, None)
    return ReleaseProgress(release_id, len(calls), first, reports, accepted, shadowed, base)


def _own(call: dict[str, Any]) -> bool:
    """Whether the release's own model answered the call: one the scenario's teacher took over
    (its arm `teacher`) is the student's failure, however well the teacher did."""
    return call.get("arm") != TEACHER_ARM


def _scores(call: dict[str, Any]) -> list[float]:
    """The scores a call's reports gave (those that may be learned from)."""
    return [r["score"] for r in call.get("reports", []) if r.get("score") is not None and trains(r)]


def _accepts(scorer: ScorerSpec, call: dict[str, Any]) -> bool:
    try:
        messages = call["request"].get("messages") or []
        task = EvalTask(id=call["id"], messages=messages, scorer=scorer)
        return score(scorer, response_text(call["response"]), task) >= 0.5
    except Exception:  # a scorer that fails on one answer fails that answer, not the table
        return False


def recipe_scorer(config: ReefConfig, scenario: str) -> ScorerSpec | None:
    """The scorer of the first of `scenario`'s recipes that sets one, or None."""
    for plan in config.learning_plans():
        if plan.scenario != scenario:
            continue
        for choice in plan.recipes:
            spec = choice.settings().get("scorer")
            if spec:
                try:
                    return program_scorer(ScorerSpec.model_validate(spec))
                except ValueError:  # the worker refuses it and says why
                    return None
    return None


def learning_progress(
    store: ExperienceStore, config: ReefConfig, limit: int = PROGRESS_CALLS
) -> dict[str, list[ReleaseProgress]]:
    """The releases of each scenario that learns or has calls, with their live pass rates
    (`live_progress`), over its newest `limit` calls."""
    with_calls = [name for name, n in store.stats()["scenarios"].items() if n["records"]]
    learning = [plan.scenario for plan in config.learning_plans()]
    return {
        scenario: live_progress(
            store,
            scenario,
            config.gate_for(scenario).replay_threshold,
            recipe_scorer(config, scenario),
            limit,
        )
        for scenario in sorted({*learning, *with_calls})
    }
