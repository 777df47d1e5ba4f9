"""One connection to the experience store's database, SQLite or PostgreSQL.

The store speaks one SQL to both: statements take `?` and `:name` parameters, rows are built
from dicts (`insert`, `upsert`, `update`), JSON is stored as text, and the few things the two
databases say differently (how to begin a write, a JSON field, the schema's types) are methods
here. `reef.store.sqlite` and `reef.store.postgres` implement it; `reef.store.backends.connect`
picks one from where the store lives: a path (SQLite, the default) or a `postgresql://` URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from reef.errors import ReefError

T = TypeVar("T")

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    """Whether `location` names a PostgreSQL database (a URL) rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


class StoreUnavailable(ReefError):
    """The experience store could not be opened or reached; the message says why and what to
    do. Nothing was stored."""

    status = 503
    code = "store_unavailable"


class Cursor(Protocol):
    """What a statement returns: DB-API rows and column descriptions."""

    @property
    def description(self) -> Sequence[Sequence[Any]] | None: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    @property
    def rowcount(self) -> int:
        """The rows an INSERT, UPDATE or DELETE changed."""
        ...


class Database(ABC):
    """A connection in autocommit mode: transactions are begun and ended explicitly."""

    dialect: str

    @property
    @abstractmethod
    def name(self) -> str:
        """Where the database is, for messages (a URL without its password)."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        """Run one statement with `?` (a sequence) or `:name` (a mapping) parameters."""

    @abstractmethod
    def begin_write(self, ordered: bool = False) -> None:
        """Begin a transaction that will write, waiting (up to a timeout) for other writers.

        `ordered`: it will insert records, whose `seq` readers page by (`?after=`), so it must
        commit in `seq` order with every other such transaction, of any process: one that
        drew a lower `seq` never commits after one that drew a higher one. SQLite's write lock
        does that for every transaction; PostgreSQL takes a lock for it (see there)."""

    @abstractmethod
    def begin_write_now(self) -> bool:
        """Begin a writing transaction only if that needs no wait for another process; False
        (and no transaction) when it would."""

    @property
    @abstractmethod
    def in_transaction(self) -> bool: ...

    def commit(self) -> None:
        """Commit the transaction begun with `begin_write`."""
        self.execute("COMMIT")

    # Whether `pipelined` saves round trips: statements sent without waiting for each answer.
    pipelines: bool = False

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        """A block whose statements go to the database without waiting for each answer, for
        statements whose results nobody reads; an error surfaces at the block's end at the
        latest. Here (a database in this process) a block like any other."""
        yield

    @abstractmethod
    def schema(self, sql: str) -> str:
        """A migration's portable DDL in this database's words."""

    def retrying(self, operation: Callable[[], T], timeout_s: float) -> T:
        """Run `operation`, again while another process holds a lock the database does not
        wait for (SQLite's, while it switches to WAL or migrates), up to `timeout_s`."""
        return operation()

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """Held while migrations run, so that two processes never apply one twice."""
        yield

    @abstractmethod
    def sql_now(self) -> str:
        """SQL for the database's clock, in seconds since the epoch: one clock for every
        process that shares the database."""

    @abstractmethod
    def sql_json_number(self, column: str, key: str) -> str:
        """SQL for the number at `key` of the JSON object in `column`."""

    @abstractmethod
    def sql_json_length(self, column: str, key: str) -> str:
        """SQL for the length of the JSON array at `key` of `column` (NULL when absent)."""

    @abstractmethod
    def continue_sequence(self, table: str) -> None:
        """After rows were written with their own `seq`, make new rows number on after them."""

    @abstractmethod
    def sql_search(self) -> str:
        """A condition on `records` true where its request or response holds every word of the
        text the one parameter (`search_terms`) carries (migration 0024's index)."""

    @abstractmethod
    def sql_index_records(self) -> str:
        """The statement that adds the records stored since the last search to the search
        index: records commit in `seq` order (`begin_write`), so they are those above the
        largest `seq` indexed."""

    def search_terms(self, text: str) -> str:
        """The parameter of `sql_search` for the words of `text`."""
        return text

    def sql_like(self) -> str:
        """The operator that matches a LIKE pattern ignoring case (SQLite's LIKE does)."""
        return "LIKE"

    @abstractmethod
    def size_bytes(self) -> int:
        """What the database takes on disk."""

    @abstractmethod
    def close(self) -> None: ...

    # Whether `notify` reaches other processes (PostgreSQL's NOTIFY): where not, they poll.
    notifies = False

    def notify(self, channel: str, payload: str) -> None:
        """Tell every process listening on `channel`, once the transaction commits (where the
        database can: see `notifies`)."""
        return None

    def unavailable(self, error: BaseException) -> BaseException:
        """`error` as the caller should see it: a `StoreUnavailable` where it says the database
        cannot be reached (a caller can try again later), else itself."""
        return error

    # -- rows from dicts: the same SQL for both ----------------------------------------------

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        columns = list(row)
        self.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(':' + column for column in columns)})",
            row,
        )

    def insert_if_absent(self, table: str, row: Mapping[str, Any], key: str) -> bool:
        """Insert `row` unless a row with its `key` exists (or is being inserted by another
        transaction, which this waits for); whether it was inserted. One statement: two
        writers inserting one key at once never fail, one of them inserts it."""
        columns = list(row)
        inserted = self.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(':' + column for column in columns)}) "
            f"ON CONFLICT ({key}) DO NOTHING",
            row,
        )
        return inserted.rowcount == 1

    def insert_all(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.insert(table, row)

    def insert_many(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert `rows`, which all have the same columns, in their order: here one statement
        each, where a statement costs no round trip."""
        self.insert_all(table, rows)

    def upsert(self, table: str, row: Mapping[str, Any], key: str) -> None:
        """Insert `row`, or update the row whose `key` column has its value."""
        columns = list(row)
        updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column != key)
        self.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(':' + column for column in columns)}) "
            f"ON CONFLICT ({key}) DO UPDATE SET {updates}",
            row,
        )

    def update(self, table: str, key: str, value: Any, values: Mapping[str, Any]) -> int:
        """Set `values` on the rows whose `key` column is `value`; how many rows it changed."""
        assignments = ", ".join(f"{column} = :{column}" for column in values)
        return self.execute(
            f"UPDATE {table} SET {assignments} WHERE {key} = :_key", {**values, "_key": value}
        ).rowcount

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict]:
        """The statement's rows as dicts."""
        cursor = self.execute(sql, params)
        columns = [column[0] for column in cursor.description or ()]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
