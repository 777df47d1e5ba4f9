"""A chain's health, release by release: what each release forgot, and what it carried to prompts
it never learned from, read from the gates' evaluations.

The forms are upstream's `reef-eval` metrics (`forgetting`, `transfer`), with a chain of
releases as the stream and each release's gate as its evaluation at that position:

- **forgetting** (Chaudhry et al., 2018, as `reef_eval.metrics.forgetting`): for each task a
  release's gate answered that an earlier gate answered too (the same task, by `task_hash`), the
  best score any earlier release (or the base, the first gate's current side) reached on it,
  less this release's; the release's forgetting is their mean, with the tasks that fell. Only
  the groups that must be kept count: not `feedback` (the users' held-out calls, new at each
  gate) nor `replay` (the traffic's good answers, which change).
- **transfer** (as `reef_eval.metrics.transfer`, the stream's score against the same tasks run
  without it): on the `feedback` group, prompts the release never learned from, its sampled
  pass rate against the release it replaced on the same prompts, with the change's 95%
  interval.

Ours differs from reef-eval's in what a position is (a release, not an episode) and in
reading scores the gate already measured, so no task is answered again for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from reef.evaluation.intervals import change_interval
from reef.evaluation.tasks import FEEDBACK_GROUP

# Groups whose tasks change from gate to gate: no earlier score to forget.
NOT_KEPT = frozenset({FEEDBACK_GROUP, "replay"})


@dataclass(frozen=True)
class Forgetting:
    mean: float  # best earlier score less this release's, averaged over the tasks compared
    tasks: int  # tasks an earlier gate answered too
    fell: int  # of them, those this release scores below their best earlier
    worst: str | None  # the task that fell most, "id (best -> now)"

    def said(self) -> str:
        if not self.fell:
            return f"forgot none of {self.tasks} task(s)"
        fell = f"{self.fell} of {self.tasks} task(s) fell (mean {self.mean:+.2f})"
        return f"{fell}, most {self.worst}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Transfer:
    before: int  # feedback samples passed by the release it replaced
    after: int  # and by this release
    count: int  # samples on each side

    def said(self) -> str:
        low, high = change_interval(self.before, self.after, self.count)
        return (
            f"held-out {self.before}/{self.count} -> {self.after}/{self.count} "
            f"[{low:+.0%}, {high:+.0%}]"
        )

    def to_json(self) -> dict[str, Any]:
        low, high = change_interval(self.before, self.after, self.count)
        return asdict(self) | {"low": round(low, 4), "high": round(high, 4)}


def transfer(evaluation: dict[str, Any] | None) -> Transfer | None:
    """The release's gain on prompts it never learned from (its gate's `feedback` group), or
    None where its gate had none (or counted no samples)."""
    groups = (evaluation or {}).get("groups") or {}
    found = groups.get(FEEDBACK_GROUP) if isinstance(groups, dict) else None
    if not isinstance(found, dict) or not found.get("answered"):
        return None
    return Transfer(
        int(found["current_passes"]), int(found["candidate_passes"]), int(found["answered"])
    )


def forgetting(
    chain: Iterable[tuple[str, dict[str, Any] | None]],
) -> dict[str, Forgetting]:
    """Each release's forgetting, given the chain oldest first as (release id, evaluation);
    a release whose gate shares no kept task with an earlier one has none."""
    best: dict[str, float] = {}  # task hash -> the best score an earlier release reached
    found: dict[str, Forgetting] = {}
    for release_id, evaluation in chain:
        results = _kept_results(evaluation)
        for result in results:  # the base, before any release: the first gate's current side
            best.setdefault(result["task_hash"], float(result["current_score"]))
        drops = [
            (best[r["task_hash"]] - float(r["candidate_score"]), r)
            for r in results
            if r["task_hash"] in best
        ]
        if drops:
            found[release_id] = _forgot(drops, best)
        for result in results:
            key = result["task_hash"]
            best[key] = max(best.get(key, 0.0), float(result["candidate_score"]))
    return found


@dataclass(frozen=True)
class Health:
    """A release's forgetting and transfer, either None where its gate could not say."""

    forgetting: Forgetting | None
    transfer: Transfer | None

    def said(self) -> str:
        """"forgot none of 6 task(s); held-out 0/24 -> 21/24 [+64%, +96%]", or "-"."""
        parts = [found.said() for found in (self.forgetting, self.transfer) if found]
        return "; ".join(parts) or "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "forgetting": self.forgetting.to_json() if self.forgetting else None,
            "transfer": self.transfer.to_json() if self.transfer else None,
        }


def chain_health(chain: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Health]:
    """Each release's health, given the chain oldest first as (release id, evaluation)."""
    forgot = forgetting(chain)
    return {
        release_id: Health(forgot.get(release_id), transfer(evaluation))
        for release_id, evaluation in chain
    }


def _kept_results(evaluation: dict[str, Any] | None) -> list[dict[str, Any]]:
    results = (evaluation or {}).get("results") or []
    return [
        r
        for r in results
        if isinstance(r, dict) and r.get("task_hash") and r.get("group") not in NOT_KEPT
    ]


def _forgot(drops: list[tuple[float, dict[str, Any]]], best: dict[str, float]) -> Forgetting:
    fell = [(drop, result) for drop, result in drops if drop > 0]
    worst = None
    if fell:
        _, result = max(fell, key=lambda pair: pair[0])
        was, now = best[result["task_hash"]], float(result["candidate_score"])
        worst = f"{result['task_id']} ({was:.2f} -> {now:.2f})"
    mean = sum(drop for drop, _ in drops) / len(drops)
    return Forgetting(round(mean, 4), len(drops), len(fell), worst)
