"""The bar a task is held to: the best score any released release of the scenario reached on it.

Counted against the release just before, losses add up along a chain: with `max_lost: 1`, five
releases in a row that each lose one task all pass, and five tasks are gone. Counted against the
best released, the total lost stays within the rule whatever the path: a rollback or a forced
release that serves a worse release again lowers nothing, since the best is taken over the whole
chain.

The scores come from the evaluations that released each release (both sides: the current
release's scores seed the first one), per task and per what it asks (`tasks.task_hash`), so an
edited task is a new task, seeded by the current release's score the first time it is seen.
Only evaluations answered the same way count: a greedy answer's score is no bar for a sampled
pass rate (a base that passes a task greedy may pass it 0 times in 6 sampled), so after the gate
began sampling, the bar is rebuilt from sampled evaluations.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reef.evaluation.runner import PairedReport


@dataclass(frozen=True)
class Reference:
    score: float
    release_id: str  # the release that scored it (`base`: the model alone)


def task_key(task_id: str, task_hash: str) -> str:
    return f"{task_id}#{task_hash}"


def best_released(
    evaluations: Iterable[tuple[str, dict[str, Any]]], sampled: bool | None = None
) -> dict[str, Reference]:
    """Per task key, the best score in `evaluations`: (the release id, the evaluation summary
    that released it) pairs; with `sampled`, only those answered that way (several samples a
    task, or one). A result without a task hash (evaluated before tasks had one) is left out:
    what it asked is not known."""
    best: dict[str, Reference] = {}
    for release_id, evaluation in evaluations:
        if sampled is not None and answered_sampled(evaluation) != sampled:
            continue
        current_id = str(evaluation.get("current_release_id") or "base")
        for result in evaluation.get("results") or []:
            if not result.get("task_hash"):
                continue
            key = task_key(result["task_id"], result["task_hash"])
            for score, scorer in (
                (result["current_score"], current_id),
                (result["candidate_score"], release_id),
            ):
                if key not in best or score > best[key].score:
                    best[key] = Reference(float(score), scorer)
    return best


def answered_sampled(evaluation: dict[str, Any]) -> bool:
    """Whether an evaluation answered each task several times (before the gate recorded its
    sampling, it answered once, greedy)."""
    sampling = evaluation.get("sampling") or {}
    return int(sampling.get("samples") or 1) > 1


def hold_to(report: PairedReport, references: dict[str, Reference]) -> None:
    """Give each task of `report` its reference, where one is known."""
    for task in report.tasks:
        reference = references.get(task_key(task.task_id, task.task_hash))
        if reference is not None:
            task.reference_score = reference.score
            task.reference_release_id = reference.release_id
