"""The store's two backends, chosen by where the store is: a `postgresql://` URL or a SQLite
file. Both implement `reef.store.database.Database`; this module alone imports them."""

from __future__ import annotations

from pathlib import Path

from reef.store.database import Database, is_postgres
from reef.store.postgres import PostgresDatabase
from reef.store.sqlite import SqliteDatabase


def connect(location: str | Path, synchronous: str, busy_timeout_s: float) -> Database:
    """A connection to the store at `location`: a `postgresql://` URL, or a SQLite file."""
    if is_postgres(location):
        return PostgresDatabase.connect(str(location), busy_timeout_s)
    return SqliteDatabase.connect(Path(location), synchronous, busy_timeout_s)
