"""Records and reports imported from elsewhere (`POST /reef/records/batch`, `reef import`):
which of them are stored already, and the new records written once, in one transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from reef.errors import Conflict
from reef.store.database import Database
from reef.store.experience import ExperienceStore, Record

ID_CHUNK = 500  # ids per query: far under every backend's limit on parameters


def stored_rows(store: ExperienceStore, table: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The rows of `table` (records or reports) with these ids: their scenario and hash."""
    found: dict[str, dict[str, Any]] = {}
    for chunk in _chunks(ids):
        marks = ", ".join("?" * len(chunk))
        for row in store.query(
            f"SELECT id, scenario, content_hash FROM {table} WHERE id IN ({marks})", chunk
        ):
            found[row["id"]] = row
    return found


def stored_otherwise(kind: str, record_id: str, scenario: str) -> Conflict:
    """The error for an id stored already with other content."""
    return Conflict(
        f"{kind} id {record_id!r} is already stored in scenario {scenario!r} with other "
        "content: records are immutable, so give the changed one a new agent_record_id",
        code="record_id_conflict",
    )


def insert_new_records(
    records: list[Record], annotations: dict[str, dict[str, Any]], source: str
) -> Callable[[Database], int]:
    """The writer job storing the new records (and their annotations, from `source`): one
    transaction, ids checked again in it (a concurrent import of the same ids may have landed
    since the read); it answers how many it added."""

    def insert(db: Database) -> int:
        present = _present(db, {record.id: record.content_hash for record in records})
        added = 0
        now = time.time()
        for record in records:
            if record.id in present:
                continue
            db.insert("records", record.to_row())
            if record.id in annotations:
                db.insert(
                    "record_annotations",
                    {
                        "record_id": record.id,
                        "scenario": record.scenario,
                        "source": source,
                        "created_at": now,
                        "data": json.dumps(annotations[record.id]),
                    },
                )
            added += 1
        return added

    return insert


def _present(db: Database, hashes: dict[str, str]) -> set[str]:
    """The ids already stored with the same content; `Conflict` for one with other content."""
    present = set()
    for chunk in _chunks(list(hashes)):
        marks = ", ".join("?" * len(chunk))
        rows = db.execute(
            f"SELECT id, content_hash, scenario FROM records WHERE id IN ({marks})", chunk
        ).fetchall()
        for record_id, stored_hash, stored_scenario in rows:
            if stored_hash != hashes[record_id]:
                raise stored_otherwise("record", record_id, stored_scenario)
            present.add(record_id)
    return present


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[start : start + ID_CHUNK] for start in range(0, len(ids), ID_CHUNK)]
