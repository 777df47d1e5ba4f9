"""Candidates: proposed artifacts and their way through the gate, persisted in experience.db.

States: proposed -> evaluating -> released | rejected | held; a held candidate waits for a
human, who approves (released) or rejects it. A candidate's files live in
`.reef/candidates/<id>/` (a released one's are also in the release chain); the folders of decided
candidates are pruned beyond `retention.candidates`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.errors import BadRequest, Conflict, NotFound
from reef.store import ExperienceStore, new_id
from reef.store.database import Database

STATES = ("proposed", "evaluating", "released", "rejected", "held", "canary", "shadow")
OPEN_STATES = ("proposed", "evaluating", "held", "canary", "shadow")
_JSON_FIELDS = ("evaluation", "consumed_record_ids", "metrics")

CANDIDATE_PREFIX = "cand"  # every candidate's id: cand_<time>_<random>


def is_candidate_id(text: str) -> bool:
    """Whether `text` has the shape of a candidate's id (a release's is SCENARIO@N)."""
    return text.startswith(f"{CANDIDATE_PREFIX}_")


# The source of a candidate an agent proposed (POST /reef/harness/proposals), not a recipe.
AGENT_SOURCE = "agent"


@dataclass
class Candidate:
    scenario: str
    kind: str
    files_path: str
    base_release_id: str | None
    source: str = "cli"
    reason: str | None = None
    state: str = "proposed"
    decision: str | None = None
    evaluation: dict[str, Any] | None = None
    release_id: str | None = None
    consumed_record_ids: list[str] = field(default_factory=list)
    evaluating_pid: int | None = None  # the process running its gate, while it is evaluating
    evaluating_host: str | None = None  # the machine that process runs on
    # The database's clock when the gating process last said it is still evaluating.
    evaluation_heartbeat_at: float | None = None
    # What the recipe measured while building it (a training run's loss per step, ...).
    metrics: dict[str, Any] | None = None
    # Rejected without a judgement of its merits (the gate could not run or finish, publishing
    # failed, the head moved): a learning worker retries after a pause.
    unjudged: bool = False
    # True once its records went back to learning (it was unjudged, or the gate returns a
    # rejected candidate's records): later steps may train on them again.
    records_returned: bool = False
    id: str = field(default_factory=lambda: new_id(CANDIDATE_PREFIX))
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def folder(self) -> Path:
        return Path(self.files_path)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class CandidateStore:
    def __init__(self, store: ExperienceStore) -> None:
        self.store = store

    def add(self, candidate: Candidate) -> Candidate:
        row = candidate.to_json()
        for name in _JSON_FIELDS:
            row[name] = json.dumps(row[name])

        def insert(db: Database) -> None:
            db.insert("candidates", row)
            # Which records it consumed, queryable: they are never trained on again.
            db.insert_all(
                "candidate_records",
                (
                    {"candidate_id": candidate.id, "record_id": r}
                    for r in dict.fromkeys(candidate.consumed_record_ids)
                ),
            )

        self.store.write(insert).result()
        return candidate

    def consumed_record_ids(self, scenario: str, source: str | None = None) -> set[str]:
        """The records a candidate of `scenario` (from `source`, a recipe's name, when given)
        holds: open ones, released ones, and rejected ones whose records were not returned.
        Each recipe of a scenario consumes records for itself: what one learned from, another
        may still learn from."""
        where, params = "c.scenario = ? AND c.records_returned = 0", [scenario]
        if source is not None:
            where, params = f"{where} AND c.source = ?", [scenario, source]
        rows = self.store.query(
            "SELECT cr.record_id FROM candidate_records cr "
            f"JOIN candidates c ON c.id = cr.candidate_id WHERE {where}",
            params,
        )
        return {row["record_id"] for row in rows}

    def open_ids(self) -> set[str]:
        """Candidates still proposed, evaluating or held."""
        marks = ",".join("?" * len(OPEN_STATES))
        rows = self.store.query(f"SELECT id FROM candidates WHERE state IN ({marks})", OPEN_STATES)
        return {row["id"] for row in rows}

    def open_base_release_ids(self) -> set[str]:
        """The releases that open candidates were proposed against (and are evaluated on)."""
        marks = ",".join("?" * len(OPEN_STATES))
        rows = self.store.query(
            "SELECT DISTINCT base_release_id FROM candidates "
            f"WHERE state IN ({marks}) AND base_release_id IS NOT NULL",
            OPEN_STATES,
        )
        return {row["base_release_id"] for row in rows}

    def decided_ids(self) -> list[str]:
        """Released and rejected candidates, newest first."""
        rows = self.store.query(
            "SELECT id FROM candidates WHERE state IN ('released', 'rejected') ORDER BY seq DESC"
        )
        return [row["id"] for row in rows]

    def silent_evaluations(self, seconds: float) -> set[str]:
        """Evaluating candidates whose heartbeat is older than `seconds`, by the database's
        clock (a heartbeat never renewed is not silent: its process may be starting)."""
        rows = self.store.query(
            "SELECT id FROM candidates WHERE state = 'evaluating' "
            "AND evaluation_heartbeat_at IS NOT NULL "
            f"AND evaluation_heartbeat_at < {self.store.sql_now()} - ?",
            [seconds],
        )
        return {row["id"] for row in rows}

    def beat(self, candidate_id: str) -> bool:
        """Renew an evaluating candidate's heartbeat; whether it is still evaluating."""

        def renew(db: Database) -> int:
            return int(
                db.execute(
                    f"UPDATE candidates SET evaluation_heartbeat_at = {db.sql_now()} "
                    "WHERE id = ? AND state = 'evaluating'",
                    [candidate_id],
                ).rowcount
            )

        return bool(self.store.write(renew).result())

    def get(self, candidate_id: str) -> Candidate:
        rows = self.store.query("SELECT * FROM candidates WHERE id = ?", [candidate_id])
        if not rows:
            raise NotFound(
                f"no candidate {candidate_id!r}: `reef release candidates` lists them",
                code="unknown_candidate",
            )
        return _decode(rows[0])

    def list(self, scenario: str | None = None, state: str | None = None) -> list[Candidate]:
        where, params = [], []
        if scenario:
            where.append("scenario = ?")
            params.append(scenario)
        if state:
            if state not in STATES:
                raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state!r}")
            where.append("state = ?")
            params.append(state)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self.store.query(f"SELECT * FROM candidates {clause} ORDER BY seq DESC", params)
        return [_decode(row) for row in rows]

    def move(
        self, candidate_id: str, allowed_from: tuple[str, ...], to: str, **fields: Any
    ) -> Candidate:
        """Change a candidate's state if it is in one of `allowed_from`: one compare-and-set
        in SQL (`UPDATE ... WHERE id = ? AND state IN (...)`), so of two processes moving it at
        once exactly one succeeds and the other gets `Conflict`, on PostgreSQL too, where a
        read before the update would let both pass. Returns the candidate as moved."""
        marks = ", ".join(f":_from{i}" for i in range(len(allowed_from))) or "NULL"
        values = {name: json.dumps(v) if name in _JSON_FIELDS else v for name, v in fields.items()}
        values = {**values, "state": to, "updated_at": time.time()}
        assignments = ", ".join(f"{name} = :{name}" for name in values)
        params = {
            **values,
            **{f"_from{i}": state for i, state in enumerate(allowed_from)},
            "_id": candidate_id,
        }

        def transition(db: Database) -> Candidate:
            moved = db.execute(
                f"UPDATE candidates SET {assignments} WHERE id = :_id AND state IN ({marks})",
                params,
            ).rowcount
            rows = db.rows("SELECT * FROM candidates WHERE id = ?", [candidate_id])
            if not rows:
                raise NotFound(f"no candidate {candidate_id!r}", code="unknown_candidate")
            if not moved:
                raise Conflict(
                    f"candidate {candidate_id} is {rows[0]['state']}; only a candidate that is "
                    f"{' or '.join(allowed_from)} can become {to}",
                    code="candidate_state",
                )
            return _decode(rows[0])

        return self.store.write(transition).result()


def _decode(row: dict[str, Any]) -> Candidate:
    row = dict(row)
    row.pop("seq", None)
    for name in _JSON_FIELDS:
        row[name] = json.loads(row[name]) if row[name] is not None else None
    row["consumed_record_ids"] = row["consumed_record_ids"] or []
    row["unjudged"] = bool(row["unjudged"])
    row["records_returned"] = bool(row["records_returned"])
    return Candidate(**row)
