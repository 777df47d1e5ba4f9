"""Replay: a scenario's own good answers, held back from learning, become gate tasks.

A recipe that learns a preference can forget everything else, and a scenario's eval tasks may be
few. So one in `HOLD_BACK_ONE_IN` of the answers users scored well (at or above the gate's
`replay_threshold`; calls outside any session) is never trained on, chosen by its record id so
that every process agrees, and the gate asks the candidate the same question again: it passes
while its answer still says what the good answer said (the `reference` scorer, group `replay`).
"""

from __future__ import annotations

import hashlib
import statistics
from typing import Any

from reef.evaluation.private import first_private
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.protocol import response_text
from reef.store import ExperienceStore

HOLD_BACK_ONE_IN = 4
REPLAY_GROUP = "replay"


def held_back(record_id: str) -> bool:
    """Whether a good answer with this record id is kept out of learning, for the gate."""
    return hashlib.sha256(record_id.encode()).digest()[0] % HOLD_BACK_ONE_IN == 0


def trains(report: dict[str, Any]) -> bool:
    """Whether a report may be learned from: all but those whose metadata says
    `{"training": {"eligible": false}}` (stored, shown, never trained on or replayed)."""
    training = (report.get("metadata") or {}).get("training")
    return not (isinstance(training, dict) and training.get("eligible") is False)


def good(record: dict[str, Any], threshold: float) -> bool:
    scores = [
        r["score"] for r in record.get("reports", []) if r.get("score") is not None and trains(r)
    ]
    return bool(scores) and statistics.fmean(scores) >= threshold


def replay_tasks(
    store: ExperienceStore, scenario: str, threshold: float, limit: int
) -> list[EvalTask]:
    """The newest `limit` held-back good answers of `scenario`, as tasks."""
    if limit <= 0:
        return []
    tasks = []
    for record in store.scored_records(scenario):
        if not (held_back(record["id"]) and good(record, threshold)):
            continue
        if first_private([record["request"].get("messages"), record["response"]]) is not None:
            continue  # a gate's tasks and answers are shown to reviewers: no user's private data
        answer = response_text(record["response"])
        messages = record["request"].get("messages")
        if answer.strip() and messages:
            scorer = ScorerSpec(type="reference", value=answer)
            tasks.append(
                EvalTask(
                    id=f"replay:{record['id']}",
                    messages=messages,
                    scorer=scorer,
                    group=REPLAY_GROUP,
                )
            )
        if len(tasks) >= limit:
            break
    return tasks
