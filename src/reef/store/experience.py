"""The experience store: every served call as a record, every piece of feedback as a report.

One SQLite file in WAL mode by default, or a PostgreSQL database (`reef.store.database`). All
writes go through one writer (`reef.store.writer`) that commits in groups: each caller waits
until the transaction holding its row has committed, so a receipt handed out is a row on disk,
and many concurrent callers share one commit (and one fsync). A record may be handed over as a
function that builds it, so that building, hashing and serialising run on the writer thread
rather than on the caller's event loop (except for a caller `alone`, whose record an idle SQLite
writer lets it commit on its own thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from reef.store import postgres
from reef.store.backends import connect
from reef.store.database import Database, StoreUnavailable, is_postgres
from reef.store.migrations import apply_migrations
from reef.store.sqlite import is_locked
from reef.store.writer import GroupCommitWriter, Inserts, WriterStats
from reef.urls import without_password

T = TypeVar("T")

JSON_COLUMNS = (
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "usage",
    "sampling",
)


class StoreError(Exception):
    """Base class for errors a caller can act on."""


class UnknownRecords(StoreError):
    def __init__(self, missing: list[str], scenario: str) -> None:
        self.missing = missing
        self.scenario = scenario
        super().__init__(
            f"unknown record id(s) in scenario {scenario!r}: {', '.join(missing)} "
            "(use the x-reef-agent-record-id receipts returned by this server, and send the same "
            "x-reef-scenario header as the calls that produced them)"
        )


class ReportConflict(StoreError):
    def __init__(self, report_id: str) -> None:
        self.report_id = report_id
        super().__init__(
            f"report_id {report_id!r} was already used for a report with different content; "
            "send a new report_id, or the same content to get the stored report back"
        )


def new_id(prefix: str) -> str:
    """A time-ordered, collision-resistant id such as `rec_0193c1a2b3c4_9f2e4d1a7b6c`."""
    return f"{prefix}_{int(time.time() * 1000):012x}_{secrets.token_hex(6)}"


def canonical_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


@dataclass
class Record:
    """One served call, as stored. `request` and `response` are OpenAI-shaped JSON objects."""

    scenario: str
    request: dict[str, Any]
    response: dict[str, Any]
    engine: str
    release_id: str
    model: str | None = None
    session: str | None = None
    stream: bool = False
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    # The prompt's token ids as the engine read it, where the engine renders prompts itself.
    prompt_token_ids: list[int] | None = None
    # The sampling settings the engine drew the answer with, defaults included.
    sampling: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    # Under a routing policy: the release whose policy routed the call, and the arm it took.
    routing_release_id: str | None = None
    arm: str | None = None
    # The teacher answered because this arm's answer failed its check (`arm` is `teacher`).
    failed_arm: str | None = None
    # The client's `x-reef-tag-<name>` headers, name -> value (`record_tags`, not a column).
    tags: dict[str, str] = field(default_factory=dict, compare=False)
    id: str = field(default_factory=lambda: new_id("rec"))
    created_at: float = field(default_factory=time.time)
    content_hash: str = ""
    # `request` and `response` as JSON text where the caller has it already (the bytes a client
    # sent, the bytes an upstream answered): stored as it is instead of serialised again.
    request_json: str | None = field(default=None, repr=False, compare=False)
    response_json: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.content_hash:
            # What was asked, not what was answered: identical retries share a hash. The session
            # keeps identical turns of different sessions apart; it is left out when there is
            # none, so that such records hash as they did before sessions counted.
            asked: dict[str, Any] = {"scenario": self.scenario, "request": self.request}
            if self.session is not None:
                asked["session"] = self.session
            self.content_hash = canonical_hash(asked)

    def to_row(self) -> dict[str, Any]:
        usage = self.usage or {}
        return {
            "id": self.id,
            "scenario": self.scenario,
            "session": self.session,
            "created_at": self.created_at,
            "request": self.request_json or _json_text(self.request),
            "response": self.response_json or _json_text(self.response),
            "engine": self.engine,
            "model": self.model,
            "release_id": self.release_id,
            "stream": int(self.stream),
            "completion_token_ids": _json_text(self.completion_token_ids),
            "completion_logprobs": _json_text(self.completion_logprobs),
            "prompt_token_ids": _json_text(self.prompt_token_ids),
            "sampling": _json_text(self.sampling),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "usage": _json_text(self.usage),
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "content_hash": self.content_hash,
            "routing_release_id": self.routing_release_id,
            "arm": self.arm,
            "failed_arm": self.failed_arm,
        }


@dataclass
class Report:
    """Feedback against one or more records."""

    scenario: str
    references: list[str]
    score: float | None = None
    feedback: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: new_id("rep"))
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.score is not None and not math.isfinite(self.score):
            raise ValueError("score must be a finite number")

    @property
    def content_hash(self) -> str:
        return canonical_hash(
            {
                "scenario": self.scenario,
                "references": self.references,
                "score": self.score,
                "feedback": self.feedback,
                "metadata": self.metadata,
            }
        )


class ExperienceStore:
    """Records and reports in `.reef/experience.db` or a PostgreSQL database; safe to open from
    several processes."""

    def __init__(
        self,
        location: Path | str,
        synchronous: Literal["normal", "full"] = "full",
        busy_timeout_s: float = 30.0,
    ) -> None:
        """Open (or create) the store: a SQLite file's path, or a `postgresql://` URL.
        `busy_timeout_s`: how long to wait for another process that holds a lock, here and on
        every later statement."""
        self.location = location
        self.path = None if is_postgres(location) else Path(location)
        self._write_db, self._read_db = self._open(synchronous, busy_timeout_s)
        self.name = self._write_db.name  # where it is, for messages: never a password
        self._read_lock = threading.Lock()
        self._writer = GroupCommitWriter(self._write_db)
        self._writer.start()

    @property
    def writer_stats(self) -> WriterStats:
        """What this process's writer committed: commit times, jobs per commit, failures."""
        return self._writer.stats

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self._write_db.dialect

    @property
    def notifies(self) -> bool:
        """Whether `notify` reaches other processes (PostgreSQL); else they must poll."""
        return self._write_db.notifies

    def notify(self, channel: str, payload: str) -> None:
        """Tell every process listening on `channel` (`listen`), on PostgreSQL."""
        if self.notifies:
            self._writer.submit(lambda db: db.notify(channel, payload)).result()

    def listen(
        self,
        channel: str,
        on_message: Callable[[str], None],
        stop: threading.Event,
        on_connected: Callable[[], None] | None = None,
    ) -> None:
        """Call `on_message(payload)` for each notification on `channel` until `stop` (blocks:
        run it on a thread of its own); on a store that does not notify, return at once."""
        if self.notifies:
            postgres.listen(str(self.location), channel, on_message, stop, on_connected)

    def sql_now(self) -> str:
        """SQL for the database's clock (seconds since the epoch), shared by all its users."""
        return self._read_db.sql_now()

    def sql_json_number(self, column: str, key: str) -> str:
        """SQL, in this store's database, for the number at `key` of a JSON column."""
        return self._read_db.sql_json_number(column, key)

    def sql_json_length(self, column: str, key: str) -> str:
        """SQL, in this store's database, for the length of a JSON column's array at `key`."""
        return self._read_db.sql_json_length(column, key)

    def sql_like(self) -> str:
        """SQL's operator for a pattern matched ignoring case, in this store's database."""
        return self._read_db.sql_like()

    def _open(self, synchronous: str, busy_timeout_s: float) -> tuple[Database, Database]:
        """The writer's connection, migrated, and the readers' connection."""
        opened: list[Database] = []

        def connected() -> Database:
            opened.append(connect(self.location, synchronous, busy_timeout_s))
            return opened[-1]

        try:
            write_db = connected()
            write_db.retrying(lambda: apply_migrations(write_db), 2 * busy_timeout_s)
            return write_db, connected()
        except Exception as error:
            for db in opened:
                db.close()
            raise self._unavailable(error) from None

    def _unavailable(self, error: BaseException) -> StoreUnavailable:
        if is_postgres(self.location):
            if isinstance(error, ModuleNotFoundError):
                return StoreUnavailable(
                    f"the experience store is a PostgreSQL database and {error}: install "
                    "Reef with its PostgreSQL driver, pip install 'reef[postgres]'"
                )
            return StoreUnavailable(
                f"cannot open the experience store {without_password(str(self.location))}: "
                f"{error}. Check that the PostgreSQL server is running and reachable, that the "
                "database exists, and that the password is in PGPASSWORD or ~/.pgpass"
            )
        if is_locked(error):
            return StoreUnavailable(
                f"the experience store {self.location} is locked by another process (a server, "
                "a learning worker or a reef command) and stayed locked: try again once it is "
                "done, or stop the process that holds it"
            )
        return StoreUnavailable(
            f"cannot open the experience store {self.location}: {error}. Check that its folder "
            "is writable and that the file is a Reef experience.db (move a damaged one away)"
        )

    def close(self) -> None:
        self._writer.stop()
        self._write_db.close()
        self._read_db.close()

    def __enter__(self) -> ExperienceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------

    def add_record(self, record: Record | Callable[[], Record], alone: bool = False) -> Future[str]:
        """Queue a record, or a function that builds it (called where it is committed: on the
        writer thread, or on the caller's when `alone`); the future resolves to its id once it
        is committed. `alone`: the caller has no concurrent writes to share a commit with, so an
        idle writer lets it commit on its own thread."""
        return self._writer.submit_inserts(_inserting(record), here=alone, ordered=True)

    async def add_record_async(
        self, record: Record | Callable[[], Record], alone: bool = False
    ) -> str:
        """`add_record`, awaited. `alone` blocks the event loop for the commit (a fraction of a
        millisecond) instead of handing the record to the writer thread and back."""
        future = self.add_record(record, alone)
        if future.done():
            return future.result()
        return await asyncio.wrap_future(future)

    def add_report(self, report: Report) -> Future[tuple[dict[str, Any], bool]]:
        """Store a report; resolves to (stored report, created). Idempotent on `report.id`."""
        return self._writer.submit(lambda db: _insert_report(db, report))

    async def add_report_async(self, report: Report) -> tuple[dict[str, Any], bool]:
        return await asyncio.wrap_future(self.add_report(report))

    def write(self, work: Callable[[Database], T], ordered: bool = False) -> Future[T]:
        """Run `work` in the writer's next transaction (for stores built on this database).
        `ordered`: it inserts records, so that transaction commits in `seq` order with every
        other process's (`Database.begin_write`)."""
        return self._writer.submit(work, ordered=ordered)

    # -- reads ----------------------------------------------------------------------------

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts, on the read connection."""
        return self._query(sql, params)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._read_lock:
            try:
                return self._read_db.rows(sql, list(params))
            except Exception as error:
                raise self._read_db.unavailable(error) from error

    def get_record(self, record_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM records WHERE id = ?", [record_id])
        if not rows:
            return None
        return self._with_reports([_decode_record(rows[0])])[0]

    def list_records(
        self,
        scenario: str | None = None,
        after: str | None = None,
        limit: int = 50,
        tags: Mapping[str, str] | None = None,
        search: str | None = None,
    ) -> list[dict[str, Any]]:
        """Records in the order they were committed, oldest first, after the record `after`,
        with every one of `tags` and every word of `search` in what was asked or answered:
        `seq` is commit order on both databases (`Database.begin_write`), so a record that
        commits after a page was read is on a later page, never behind the cursor."""
        self._index_for_search(search)
        where, params = self._record_filter(scenario, tags, search)
        if after is not None:
            where.append("seq > (SELECT seq FROM records WHERE id = ?)")
            params.append(after)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(f"SELECT * FROM records {clause} ORDER BY seq LIMIT ?", [*params, limit])
        return self._with_reports([_decode_record(row) for row in rows])

    def latest_records(
        self,
        scenario: str | None = None,
        limit: int = 20,
        tags: Mapping[str, str] | None = None,
        search: str | None = None,
    ) -> list[dict[str, Any]]:
        """The newest records with every one of `tags` and the words of `search`, newest
        first."""
        self._index_for_search(search)
        where, params = self._record_filter(scenario, tags, search)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(
            f"SELECT * FROM records {clause} ORDER BY seq DESC LIMIT ?", [*params, limit]
        )
        return self._with_reports([_decode_record(row) for row in rows])

    def scored_records(self, scenario: str, limit: int = 500) -> list[dict[str, Any]]:
        """The newest records of `scenario` outside any session that a report scored, newest
        first, with their reports."""
        rows = self._query(
            "SELECT * FROM records WHERE scenario = ? AND session IS NULL AND id IN ("
            "  SELECT rr.record_id FROM report_references rr"
            "  JOIN reports r ON r.id = rr.report_id WHERE r.score IS NOT NULL"
            ") ORDER BY seq DESC LIMIT ?",
            [scenario, limit],
        )
        return self._with_reports([_decode_record(row) for row in rows])

    def _record_filter(
        self, scenario: str | None, tags: Mapping[str, str] | None, search: str | None
    ) -> tuple[list[str], list[Any]]:
        """The WHERE conditions (and their parameters) of records in `scenario` with all `tags`
        and every word of `search` (`_index_for_search` first)."""
        where: list[str] = []
        params: list[Any] = []
        if scenario is not None:
            where.append("scenario = ?")
            params.append(scenario)
        for name, value in (tags or {}).items():
            where.append("id IN (SELECT record_id FROM record_tags WHERE name = ? AND value = ?)")
            params += [name, value]
        words = _search_words(search)
        if words:
            where.append(self._read_db.sql_search())
            params.append(self._read_db.search_terms(words))
        return where, params

    def _index_for_search(self, search: str | None) -> None:
        """Before a search, index the records stored since the last one (storing a call writes
        nothing to the index)."""
        if _search_words(search):
            self.write(lambda db: db.execute(db.sql_index_records())).result()

    def record_exists(self, record_id: str) -> bool:
        return bool(self._query("SELECT 1 AS x FROM records WHERE id = ?", [record_id]))

    def _with_reports(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not records:
            return records
        ids = [r["id"] for r in records]
        marks = ",".join("?" * len(ids))
        rows = self._query(
            "SELECT rr.record_id, r.* FROM report_references rr "
            "JOIN reports r ON r.id = rr.report_id "
            f"WHERE rr.record_id IN ({marks}) ORDER BY r.seq",
            ids,
        )
        by_record: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        for row in rows:
            by_record[row.pop("record_id")].append(_decode_report(row))
        for record in records:
            record["reports"] = by_record[record["id"]]
        tags: dict[str, dict[str, str]] = {i: {} for i in ids}
        for row in self._query(
            f"SELECT record_id, name, value FROM record_tags WHERE record_id IN ({marks})", ids
        ):
            tags[row["record_id"]][row["name"]] = row["value"]
        for record in records:
            record["metadata"] = {"tags": tags[record["id"]]}
        return records

    def stats(self) -> dict[str, Any]:
        scenarios: dict[str, dict[str, int]] = {}
        for row in self._query("SELECT scenario, COUNT(*) AS n FROM records GROUP BY scenario"):
            scenarios.setdefault(row["scenario"], {"records": 0, "reports": 0})["records"] = row[
                "n"
            ]
        for row in self._query("SELECT scenario, COUNT(*) AS n FROM reports GROUP BY scenario"):
            scenarios.setdefault(row["scenario"], {"records": 0, "reports": 0})["reports"] = row[
                "n"
            ]
        with self._read_lock:
            try:
                size = self._read_db.size_bytes()
            except Exception as error:
                raise self._read_db.unavailable(error) from error
        return {"path": self.name, "size_bytes": size, "scenarios": scenarios}




def _search_words(search: str | None) -> str:
    """The words of a search, without control characters (a NUL), which are no part of a word
    and which neither database takes; empty for none."""
    words = "".join(" " if unicodedata.category(c) == "Cc" else c for c in search or "")
    return words.strip()


def _inserting(record: Record | Callable[[], Record]) -> Callable[[], Inserts]:
    """What storing `record` inserts: its row, then its tags'; the job answers its id."""

    def rows() -> Inserts:
        built = record if isinstance(record, Record) else record()
        tags = [
            ("record_tags", {"record_id": built.id, "name": k, "value": v})
            for k, v in built.tags.items()
        ]
        return Inserts([("records", built.to_row()), *tags], value=built.id)

    return rows


def _insert_report(db: Database, report: Report) -> tuple[dict[str, Any], bool]:
    """Insert the report, or answer the one stored under its id: the same content gets it back
    (a retry, whichever replica it reaches), other content is a `ReportConflict`.

    The insert itself decides who stores a report id (`ON CONFLICT DO NOTHING`), never a read
    before it: on PostgreSQL two replicas may both find no report and both insert, and the
    second waits for the first's commit and then inserts nothing, instead of failing."""
    if db.execute("SELECT 1 FROM reports WHERE id = ?", [report.id]).fetchone() is not None:
        return _stored_report(db, report)
    found: set[str] = set()
    if report.references:  # none: a report that grades no record (and never trains)
        marks = ",".join("?" * len(report.references))
        found = {
            row[0]
            for row in db.execute(
                f"SELECT id FROM records WHERE scenario = ? AND id IN ({marks})",
                [report.scenario, *report.references],
            ).fetchall()
        }
    missing = [ref for ref in report.references if ref not in found]
    if missing:
        raise UnknownRecords(missing, report.scenario)
    row = {
        "id": report.id,
        "scenario": report.scenario,
        "created_at": report.created_at,
        "score": report.score,
        "feedback": None if report.feedback is None else json.dumps(report.feedback),
        "metadata": None if report.metadata is None else json.dumps(report.metadata),
        "content_hash": report.content_hash,
    }
    if not db.insert_if_absent("reports", row, key="id"):  # another writer stored it just now
        return _stored_report(db, report)
    db.insert_all(
        "report_references",
        (
            {"report_id": report.id, "record_id": ref, "position": position}
            for position, ref in enumerate(dict.fromkeys(report.references))
        ),
    )
    return _read_report(db, report.id), True


def _stored_report(db: Database, report: Report) -> tuple[dict[str, Any], bool]:
    """The report stored under `report.id`, if it says what `report` says."""
    (stored_hash,) = db.execute(
        "SELECT content_hash FROM reports WHERE id = ?", [report.id]
    ).fetchone()
    if stored_hash != report.content_hash:
        raise ReportConflict(report.id)
    return _read_report(db, report.id), False


def _read_report(db: Database, report_id: str) -> dict[str, Any]:
    report = _decode_report(db.rows("SELECT * FROM reports WHERE id = ?", [report_id])[0])
    report["references"] = [
        row[0]
        for row in db.execute(
            "SELECT record_id FROM report_references WHERE report_id = ? ORDER BY position",
            [report_id],
        ).fetchall()
    ]
    return report


def _decode_record(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row.pop("seq", None)
    for column in JSON_COLUMNS:
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    row["stream"] = bool(row["stream"])
    return row


def _decode_report(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row.pop("seq", None)
    row.pop("content_hash", None)
    for column in ("feedback", "metadata"):
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    return row
