"""The database itself crashes: PostgreSQL is stopped with `pg_ctl stop -m immediate` (every
server process quits at once, no checkpoint, nothing written that was not written already) in the
middle of a burst of writes, and started again. Every record and report the store acknowledged
is there after its crash recovery.

tests/store/test_durability.py kills Reef, never the database, so it would pass even if commits
were acknowledged before PostgreSQL wrote them. Here the server is made as forgetful as it can
be (`synchronous_commit = off` by default, the WAL writer waking every 10 s): only the store's
own `SET synchronous_commit = on` stands between an acknowledgement and a loss, and the last test
shows that without it this crash does lose acknowledged records."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from reef.store import ExperienceStore, Record, Report, postgres
from reef.testing.postgres import PostgresServer
from tests.conftest import require_postgres

ACKNOWLEDGED = 150  # records acknowledged before the crash


@pytest.fixture
def database() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own (it is crashed), configured to lose what it can."""
    require_postgres()
    with PostgresServer() as server:
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
        yield server


def _record(n: int) -> Record:
    return Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": f"request {n}"}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"answer {n}"}}]},
        engine="test",
        release_id="base",
        completion_token_ids=[n, n + 1],
    )


def write_until_crash(server: PostgresServer, url: str) -> tuple[dict[str, int], dict[str, Any]]:
    """Eight writers store records (and a report on each), until `ACKNOWLEDGED` records are
    acknowledged; then the database crashes under them, still writing. The records and reports
    acknowledged: record id -> n, report id -> its stored form."""
    records: dict[str, int] = {}
    reports: dict[str, Any] = {}
    lock, enough, stop = threading.Lock(), threading.Event(), threading.Event()
    numbers = iter(range(1_000_000))

    def write(store: ExperienceStore) -> None:
        while not stop.is_set():
            with lock:
                n = next(numbers)
            try:
                record_id = store.add_record(_record(n)).result(30)
                with lock:
                    records[record_id] = n
                    if len(records) >= ACKNOWLEDGED:
                        enough.set()
                stored, _ = store.add_report(Report("default", [record_id], score=n)).result(30)
                with lock:
                    reports[stored["id"]] = stored
            except Exception:  # the database is gone (or failing): stop writing
                return

    with ExperienceStore(url, busy_timeout_s=5) as store:
        writers = [threading.Thread(target=write, args=(store,)) for _ in range(8)]
        for writer in writers:
            writer.start()
        try:
            assert enough.wait(60), "the writes were never acknowledged"
            server.crash()
        finally:
            stop.set()
            for writer in writers:
                writer.join(60)
    with lock:
        return dict(records), dict(reports)


def lost_after_restart(
    server: PostgresServer, url: str, records: dict[str, int], reports: dict[str, Any]
) -> list[str]:
    """Start the crashed server again (it recovers from its WAL) and list what was lost."""
    server.resume()
    assert "automatic recovery in progress" in server.log(200), server.log()
    lost = []
    with ExperienceStore(url) as store:
        for record_id, n in records.items():
            stored = store.get_record(record_id)
            if stored is None:
                lost.append(record_id)
                continue
            assert stored["request"] == _record(n).request
            assert stored["response"] == _record(n).response
            assert stored["completion_token_ids"] == [n, n + 1]
        for report_id, report in reports.items():
            found = store.query("SELECT score FROM reports WHERE id = ?", [report_id])
            if not found:
                lost.append(report_id)
            else:
                assert found[0]["score"] == report["score"]
    return lost


def test_a_database_crash_loses_no_acknowledged_record_or_report(
    database: PostgresServer,
) -> None:
    url = database.create_database()
    records, reports = write_until_crash(database, url)
    assert len(records) >= ACKNOWLEDGED and reports
    assert lost_after_restart(database, url, records, reports) == []


def test_the_crash_test_sees_acknowledged_records_lost_when_commits_are_not_synchronous(
    database: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same crash with the store's connections left on the server's
    `synchronous_commit = off`: commits are acknowledged before their WAL is written, and some
    of them are gone after the restart. This is what the test above would catch."""
    connect = postgres._connection

    def asynchronous(url: str, busy_timeout_s: float) -> Any:
        conn = connect(url, busy_timeout_s)
        conn.execute("SET synchronous_commit = off")
        return conn

    monkeypatch.setattr(postgres, "_connection", asynchronous)
    for _ in range(3):  # the WAL writer may have written the last page just before the crash
        url = database.create_database()
        records, reports = write_until_crash(database, url)
        if lost_after_restart(database, url, records, reports):
            return
    pytest.fail("three crashes lost no asynchronously committed record")
