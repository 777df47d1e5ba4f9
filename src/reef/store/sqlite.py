"""The experience store in one SQLite file, in WAL mode: the default, nothing to run beside Reef.

Several processes may open it (a server, a learning worker, a `reef` command): a write waits for
another process's write lock up to the busy timeout, and opening retries while a lock SQLite
does not wait for (switching to WAL, a migration) is held.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from reef.store.database import Cursor, Database

T = TypeVar("T")


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self._busy_timeout_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])

    @classmethod
    def connect(cls, path: Path, synchronous: str, busy_timeout_s: float) -> SqliteDatabase:
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + 2 * busy_timeout_s
        return retry_while_locked(lambda: cls._open(path, synchronous, busy_timeout_s), deadline)

    @classmethod
    def _open(cls, path: Path, synchronous: str, busy_timeout_s: float) -> SqliteDatabase:
        # The timeout is SQLite's busy timeout, set before any statement runs.
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        try:
            # Switching to WAL takes an exclusive lock that the busy timeout does not wait for; a
            # file already in WAL mode (every time but the first) needs no switch.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    @property
    def name(self) -> str:
        return str(self.path)

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        return self.conn.execute(sql, params if isinstance(params, Mapping) else list(params))

    def begin_write(self, ordered: bool = False) -> None:
        # The write lock, held to the commit, orders every writer's commits (`ordered` or not):
        # a `seq` drawn is committed before any other writer draws the next.
        self.conn.execute("BEGIN IMMEDIATE")

    def begin_write_now(self) -> bool:
        try:
            self.conn.execute("PRAGMA busy_timeout = 0")
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            finally:
                self.conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        except sqlite3.OperationalError:  # locked by another process (or failing)
            return False
        return True

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def schema(self, sql: str) -> str:
        return sql  # migrations are written in SQLite's words

    def retrying(self, operation: Callable[[], T], timeout_s: float) -> T:
        return retry_while_locked(operation, time.monotonic() + timeout_s)

    def sql_now(self) -> str:
        return "((julianday('now') - 2440587.5) * 86400.0)"

    def sql_json_number(self, column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    def sql_json_length(self, column: str, key: str) -> str:
        return f"json_array_length({column}, '$.{key}')"

    def sql_search(self) -> str:
        return "seq IN (SELECT rowid FROM records_search WHERE records_search MATCH ?)"

    def sql_index_records(self) -> str:
        return (
            "INSERT INTO records_search (rowid, request, response) "
            "SELECT seq, request, response FROM records "
            "WHERE seq > (SELECT COALESCE(MAX(rowid), 0) FROM records_search)"
        )

    def search_terms(self, text: str) -> str:
        # Each word a quoted string: FTS5's own query syntax (AND, NEAR, "*", ":") is not a
        # user's to write by accident, and a quote in a word is doubled.
        return " ".join('"' + word.replace('"', '""') + '"' for word in text.split())

    def continue_sequence(self, table: str) -> None:
        pass  # an INTEGER PRIMARY KEY always numbers on from the largest

    def size_bytes(self) -> int:
        files = (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
        return sum(file.stat().st_size for file in files if file.exists())

    def close(self) -> None:
        self.conn.close()


def is_locked(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, sqlite3.OperationalError) and (
        "database is locked" in text or "database table is locked" in text
    )


def retry_while_locked(operation: Callable[[], T], deadline: float) -> T:
    """Run `operation` again, after a growing random pause, while another process holds the
    lock SQLite would not wait for, until `deadline` (a time.monotonic() value)."""
    pause = 0.01
    while True:
        try:
            return operation()
        except sqlite3.OperationalError as error:
            if not is_locked(error) or time.monotonic() + pause > deadline:
                raise
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, 0.5)
