"""The experience store in PostgreSQL (`store.url: postgresql://...`), for several replicas.

psycopg 3 on two plain connections, as the SQLite store has: one for the writer (whose group
commits already share one round trip and one fsync among concurrent callers, so a pool would add
nothing to writes) and one for reads. Every commit is synchronous (`synchronous_commit = on`): a
receipt is handed out only once the server has made its record durable. The store's SQL is
written for both databases; here `?` and `:name` become psycopg's `%s` and `%(name)s`, and a
migration's SQLite types become PostgreSQL's.

The password belongs in the environment (`PGPASSWORD`, or a `~/.pgpass` file, as libpq reads
them), not in the URL; a URL's password never appears in a message.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from reef.store.database import Cursor, Database, StoreUnavailable
from reef.urls import without_password

T = TypeVar("T")
log = logging.getLogger("reef.store")

# Held while migrations run, by any process of any Reef on this database: "reef" in ASCII.
MIGRATION_LOCK = 0x72656566
# Held from the start of a transaction that inserts records to its commit, by every replica:
# "reefseq" in ASCII. See `PostgresDatabase.begin_write`.
RECORD_ORDER_LOCK = 0x72656566736571


class PostgresDatabase(Database):
    dialect = "postgresql"

    def __init__(self, conn: Any, url: str, busy_timeout_s: float) -> None:
        self.conn = conn
        self.url = url
        self._busy_timeout_s = busy_timeout_s

    @classmethod
    def connect(cls, url: str, busy_timeout_s: float) -> PostgresDatabase:
        return cls(_connection(url, busy_timeout_s), url, busy_timeout_s)

    @property
    def name(self) -> str:
        return without_password(self.url)

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        if isinstance(params, Mapping):
            values: Any = {key: _value(value) for key, value in params.items()}
        else:
            values = [_value(value) for value in params]
        if not values:  # sent as it is: psycopg reads no placeholders in it
            return self.conn.execute(sql)
        return self.conn.execute(_psycopg_sql(sql), values)

    def begin_write(self, ordered: bool = False) -> None:
        """BEGIN; when `ordered` (the transaction will insert records), then the record-order
        lock, which it holds to its commit or rollback.

        A record's `seq` is drawn from a sequence when it is inserted, but becomes visible when
        its transaction commits: without the lock, replica A draws 10 and is still committing
        while replica B draws 11 and commits, and a reader that pages past 11 (`?after=`, the
        learner's `MAX(seq)`) never sees 10. With it, transactions that insert records commit
        one at a time in the order they drew their numbers, as SQLite's write lock makes them,
        so `seq` is commit order across replicas. It is taken first, before any row lock, so it
        is in no deadlock; only record-inserting transactions wait for each other (a replica's
        group commit still shares one)."""
        self._once_more_if_lost(lambda: self.conn.execute("BEGIN"))
        if not ordered:
            return
        try:
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [RECORD_ORDER_LOCK])
        except BaseException:
            self._roll_back_quietly()
            raise

    def _roll_back_quietly(self) -> None:
        try:
            if self.in_transaction:
                self.conn.execute("ROLLBACK")
        except Exception:  # the connection is gone: so is its transaction
            pass

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict]:
        return self._once_more_if_lost(lambda: super(PostgresDatabase, self).rows(sql, params))

    def _once_more_if_lost(self, operation: Callable[[], T]) -> T:
        """`operation`, run again on a new connection if the server lost this one (it
        restarted, the network broke), but only when no transaction was open: a statement of
        a transaction never runs outside it (the transaction fails instead)."""
        idle = not self.in_transaction
        if idle and self.conn.broken:
            self.conn = _connection(self.url, self._busy_timeout_s)
        try:
            return operation()
        except Exception:
            if not (idle and self.conn.broken):
                raise
        self.conn = _connection(self.url, self._busy_timeout_s)
        return operation()

    def commit(self) -> None:
        from psycopg.pq import TransactionStatus

        # PostgreSQL answers COMMIT in a failed transaction by rolling back, without an error.
        if self.conn.info.transaction_status == TransactionStatus.INERROR:
            raise RuntimeError("the transaction failed before its commit: nothing of it is stored")
        self.conn.execute("COMMIT")

    def insert_many(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """`rows` through psycopg's `executemany`: one statement prepared once and a row of
        values for each (in a pipeline, all in its one round trip), where one `execute` per row
        adapts and sends each anew, and one multi-row INSERT has a long text that psycopg
        parses anew every time."""
        if not rows:
            return
        columns = list(rows[0])
        marks = ", ".join(["%s"] * len(columns))
        self.conn.cursor().executemany(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
            [[_value(row[column]) for column in columns] for row in rows],
        )

    pipelines = True

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        """psycopg's pipeline mode: the block's statements in one round trip, their answers read
        at its end (where a failed one raises)."""
        with self.conn.pipeline():
            yield

    def begin_write_now(self) -> bool:
        # A commit here is a round trip and an fsync on the server: never on a caller's thread
        # (the event loop); the writer thread takes every job.
        return False

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        status = self.conn.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def sql_search(self) -> str:
        return "seq IN (SELECT seq FROM records_search WHERE words @@ plainto_tsquery('simple', ?))"

    def sql_index_records(self) -> str:
        return (
            "INSERT INTO records_search (seq, words) "
            "SELECT seq, to_tsvector('simple', request || ' ' || response) FROM records "
            "WHERE seq > (SELECT COALESCE(MAX(seq), 0) FROM records_search) "
            "ON CONFLICT (seq) DO NOTHING"
        )

    def schema(self, sql: str) -> str:
        sql = re.sub(
            r"\bseq INTEGER PRIMARY KEY\b",
            "seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            sql,
        )
        return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)  # SQLite's REAL is 8 bytes

    @contextmanager
    def migrating(self) -> Iterator[None]:
        self.conn.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK])
        try:
            yield
        finally:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])

    def sql_now(self) -> str:
        return "EXTRACT(EPOCH FROM clock_timestamp())"

    def sql_json_number(self, column: str, key: str) -> str:
        return f"CAST(CAST({column} AS jsonb) ->> '{key}' AS double precision)"

    def sql_json_length(self, column: str, key: str) -> str:
        return f"jsonb_array_length(CAST({column} AS jsonb) -> '{key}')"

    def sql_like(self) -> str:
        return "ILIKE"

    def continue_sequence(self, table: str) -> None:
        self.conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), "
            f"COALESCE((SELECT MAX(seq) FROM {table}), 0) + 1, false)"
        )

    def size_bytes(self) -> int:
        return int(self.conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    def close(self) -> None:
        self.conn.close()

    notifies = True

    def notify(self, channel: str, payload: str) -> None:
        self.execute("SELECT pg_notify(?, ?)", [channel, payload])

    def unavailable(self, error: BaseException) -> BaseException:
        import psycopg

        if not isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            return error
        return StoreUnavailable(
            f"the experience store {self.name} cannot be reached ({str(error).strip()}), so "
            "this write was not confirmed: try again once the PostgreSQL server is back"
        )


def _connection(url: str, busy_timeout_s: float) -> Any:
    import psycopg

    conn = psycopg.connect(
        url,
        autocommit=True,
        connect_timeout=max(1, int(busy_timeout_s)),
        # A server the network lost without a word is noticed within half a minute: the call
        # fails (503) rather than hanging.
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
        tcp_user_timeout=30_000,
    )
    # A receipt only for a durable record, whatever the server's default; a write waits for
    # another's row lock as long as SQLite's busy timeout would.
    conn.execute("SET synchronous_commit = on")
    conn.execute(f"SET lock_timeout = '{int(busy_timeout_s * 1000)}ms'")
    return conn


def _value(value: Any) -> Any:
    # The schema has no boolean columns (SQLite has none): flags are integers, 0 or 1.
    return int(value) if isinstance(value, bool) else value


# `?`, `:name` or a `%` outside a quoted string, or a quoted string (kept as it is).
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|::|\?|:([A-Za-z_]\w*)|%")


@functools.lru_cache(maxsize=512)
def _psycopg_sql(sql: str) -> str:
    """The statement with psycopg's placeholders: `?` -> %s, `:name` -> %(name)s, % -> %%."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if match.group(1):
            return f"%({match.group(1)})s"
        return token.replace("%", "%%")  # a quoted string or a cast

    return _TOKEN.sub(replace, sql)


def listen(
    url: str,
    channel: str,
    on_message: Callable[[str], None],
    stop: threading.Event,
    on_connected: Callable[[], None] | None = None,
) -> None:
    """Call `on_message(payload)` for each NOTIFY on `channel` until `stop` is set, on a
    connection of its own, reconnecting (and calling `on_connected`, after which a caller
    should catch up on what it may have missed) whenever the server lost it."""
    import psycopg

    pause = 0.5
    while not stop.is_set():
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"LISTEN {channel}")
                pause = 0.5
                if on_connected is not None:
                    on_connected()
                while not stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        on_message(note.payload)
        except Exception as error:  # the server is away: listen again once it is back
            log.debug("listening on %s: %s", channel, error)
            stop.wait(pause)
            pause = min(pause * 2, 10.0)
