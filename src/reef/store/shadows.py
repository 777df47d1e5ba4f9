"""Shadow records: a shadow candidate's answer to a copy of a live call, kept beside that call's
record and never returned to anyone (`reef.daemon.shadow` makes them)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from reef.store.database import Database
from reef.store.experience import ExperienceStore, new_id


@dataclass
class ShadowRecord:
    scenario: str
    candidate_id: str
    live_record_id: str
    response: dict[str, Any]
    latency_ms: float | None = None
    completion_tokens: int | None = None
    live_score: float | None = None
    shadow_score: float | None = None
    id: str = field(default_factory=lambda: new_id("shd"))
    created_at: float = field(default_factory=time.time)

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "response": json.dumps(self.response, ensure_ascii=False)}


def add_shadow(store: ExperienceStore, shadow: ShadowRecord) -> str:
    def insert(db: Database) -> str:
        db.insert("shadow_records", shadow.to_row())
        return shadow.id

    return store.write(insert).result()


def shadows_of(store: ExperienceStore, candidate_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """A candidate's shadow records, newest first, each with the live answer it shadowed."""
    rows = store.query(
        "SELECT s.id AS id, s.live_record_id AS live_record_id, s.created_at AS created_at, "
        "s.response AS response, s.live_score AS live_score, s.shadow_score AS shadow_score, "
        "s.latency_ms AS latency_ms, r.request AS live_request, r.response AS live_response "
        "FROM shadow_records s JOIN records r ON r.id = s.live_record_id "
        "WHERE s.candidate_id = ? ORDER BY s.seq DESC LIMIT ?",
        [candidate_id, limit],
    )
    for row in rows:
        for name in ("response", "live_request", "live_response"):
            row[name] = json.loads(row[name])
    return rows


def shadow_summary(store: ExperienceStore, candidate_id: str) -> dict[str, Any]:
    """How many calls a candidate shadowed, and each side's mean score where scored."""
    rows = store.query(
        "SELECT live_score, shadow_score FROM shadow_records WHERE candidate_id = ?",
        [candidate_id],
    )
    scored = [r for r in rows if r["live_score"] is not None and r["shadow_score"] is not None]
    return {
        "answers": len(rows),
        "scored": len(scored),
        "live_mean": statistics.fmean(r["live_score"] for r in scored) if scored else None,
        "shadow_mean": statistics.fmean(r["shadow_score"] for r in scored) if scored else None,
    }


def shadow_scores_by_release(
    store: ExperienceStore, scenario: str, candidate_id: str, limit: int
) -> list[dict[str, Any]]:
    """The newest `limit` scored shadow records of `candidate_id` in `scenario`, each with the
    release that answered the live call it copied: `release_id`, `live_score`,
    `shadow_score`."""
    return store.query(
        "SELECT r.release_id AS release_id, s.live_score AS live_score, "
        "s.shadow_score AS shadow_score FROM shadow_records s "
        "JOIN records r ON r.id = s.live_record_id "
        "WHERE s.candidate_id = ? AND s.scenario = ? AND s.shadow_score IS NOT NULL "
        "ORDER BY s.seq DESC LIMIT ?",
        [candidate_id, scenario, limit],
    )
