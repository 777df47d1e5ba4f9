"""Moving a project's whole experience from one store to another (`reef store migrate`).

A laptop's SQLite file moves to the team's PostgreSQL server (or back): every table but the
migrations' own, row for row, with the same sequence numbers, so that receipts, reports,
candidates and the learning worker's bookkeeping read the same in the new store. The copy is one
transaction in the target: it lands whole or not at all. A target that already holds experience
is refused, so that nothing is mixed or overwritten. Stop the servers writing to the source
first: what they store during the copy is not copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reef.errors import Conflict
from reef.store.database import Database
from reef.store.experience import ExperienceStore

# In the order rows may be written (references after what they reference), each with the
# columns that order its rows.
TABLES: tuple[tuple[str, str], ...] = (
    ("records", "seq"),
    ("reports", "seq"),
    ("report_references", "report_id, position"),
    ("candidates", "seq"),
    ("candidate_records", "candidate_id, record_id"),
    ("learning_steps", "seq"),
    ("learning_status", "scenario"),
    ("train_requests", "seq"),
    ("record_annotations", "seq"),
    ("record_tags", "record_id"),
    ("shadow_records", "seq"),
    ("runtime_scenarios", "name"),
)
PAGE = 500

Progress = Callable[[str, int], None]  # (table, rows copied now)


def row_counts(store: ExperienceStore) -> dict[str, int]:
    """Each table's rows."""
    return _counts(store.query)


def _counts(rows: Callable[[str], list[dict[str, Any]]]) -> dict[str, int]:
    """Each table's rows, read by `rows(sql)`: a store's reads, or a transaction's."""
    return {table: int(rows(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]) for table, _ in TABLES}


def copy_store(
    source: ExperienceStore, target: ExperienceStore, progress: Progress | None = None
) -> dict[str, int]:
    """Copy every row of `source` into the empty `target`; the rows copied, per table."""

    def copy_all(db: Database) -> dict[str, int]:
        _refuse_if_holding(db, target.name)  # in the copy's transaction: nobody slips in
        return {table: _copy_table(source, db, table, order, progress) for table, order in TABLES}

    return target.write(copy_all).result()


def _refuse_if_holding(db: Database, name: str) -> None:
    held = {table: n for table, n in _counts(db.rows).items() if n}
    if held:
        raise Conflict(
            f"the store {name} already holds experience "
            f"({', '.join(f'{n} {table}' for table, n in held.items())}): migrate into a new, "
            "empty database, or move that one's rows away first",
            code="store_not_empty",
        )


def _copy_table(
    source: ExperienceStore, db: Database, table: str, order: str, progress: Progress | None
) -> int:
    """The table's rows, a page at a time: after the last `seq` copied where it has one (each
    page an index seek), else by position."""
    copied, last = 0, -1
    while True:
        if order == "seq":
            query = f"SELECT * FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?"
            rows = source.query(query, [last, PAGE])
        else:
            query = f"SELECT * FROM {table} ORDER BY {order} LIMIT ? OFFSET ?"
            rows = source.query(query, [PAGE, copied])
        db.insert_all(table, rows)
        copied += len(rows)
        if rows and order == "seq":
            last = rows[-1]["seq"]
        if progress is not None and rows:
            progress(table, len(rows))
        if len(rows) < PAGE:
            break
    if order == "seq":
        db.continue_sequence(table)
    return copied
