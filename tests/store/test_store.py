"""The experience store on a real SQLite file and a real PostgreSQL server: migrations, group
commits, reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from reef.store import (
    ExperienceStore,
    Record,
    Report,
    ReportConflict,
    StoreClosed,
    UnknownRecords,
)
from reef.store.experience import canonical_hash
from reef.store.migrations import MIGRATIONS


def _record(scenario: str = "default", text: str = "hi", session: str | None = None) -> Record:
    return Record(
        scenario=scenario,
        session=session,
        request={"messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": "hello"}}]},
        engine="test",
        release_id="base",
        completion_token_ids=[1, 2, 3],
        completion_logprobs=[-0.5, -0.25, -1.0],
        usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    )


def test_migrations_are_recorded_and_run_once(tmp_path: Path) -> None:
    path = tmp_path / "experience.db"
    ExperienceStore(path).close()
    ExperienceStore(path).close()
    names = [row[0] for row in sqlite3.connect(path).execute("SELECT name FROM _reef_migrations")]
    assert names == [name for name, _ in MIGRATIONS]


def test_database_is_in_wal_mode(sqlite_store: ExperienceStore) -> None:
    mode = sqlite3.connect(sqlite_store.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_record_round_trip(store: ExperienceStore) -> None:
    record = _record(session="s1")
    assert store.add_record(record).result() == record.id
    stored = store.get_record(record.id)
    assert stored is not None
    assert stored["request"] == record.request
    assert stored["completion_token_ids"] == [1, 2, 3]
    assert stored["completion_logprobs"] == [-0.5, -0.25, -1.0]
    assert stored["prompt_tokens"] == 4 and stored["completion_tokens"] == 3
    assert stored["session"] == "s1"
    assert stored["reports"] == []


def test_a_committed_record_is_visible_to_another_connection(sqlite_store: ExperienceStore) -> None:
    record_id = sqlite_store.add_record(_record()).result()
    other = sqlite3.connect(sqlite_store.path)
    assert (
        other.execute("SELECT COUNT(*) FROM records WHERE id = ?", [record_id]).fetchone()[0] == 1
    )


def test_identical_requests_share_a_content_hash() -> None:
    assert _record(text="same").content_hash == _record(text="same").content_hash
    assert _record(text="same").content_hash != _record(text="other").content_hash


def test_the_same_request_in_two_sessions_hashes_apart() -> None:
    assert _record(session="a").content_hash == _record(session="a").content_hash
    assert _record(session="a").content_hash != _record(session="b").content_hash
    # A record without a session hashes as it always did, so older rows still match it.
    unsessioned = _record()
    assert unsessioned.content_hash == canonical_hash(
        {"scenario": "default", "request": unsessioned.request}
    )


def test_concurrent_writers_share_commits_and_lose_nothing(store: ExperienceStore) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        for _ in range(n):
            record_id = store.add_record(_record()).result()
            with lock:
                ids.append(record_id)

    threads = [threading.Thread(target=write, args=(25,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 200
    stored = {r["id"] for r in store.list_records(limit=1000)}
    assert stored == set(ids)


def test_list_records_pages_in_order(store: ExperienceStore) -> None:
    ids = [store.add_record(_record(scenario="a")).result() for _ in range(5)]
    store.add_record(_record(scenario="b")).result()
    first = store.list_records(scenario="a", limit=2)
    assert [r["id"] for r in first] == ids[:2]
    rest = store.list_records(scenario="a", after=first[-1]["id"], limit=10)
    assert [r["id"] for r in rest] == ids[2:]
    assert [r["id"] for r in store.latest_records(scenario="a", limit=2)] == ids[:2:-1][:2]


def test_report_attaches_to_every_reference(store: ExperienceStore) -> None:
    a, b = (store.add_record(_record()).result() for _ in range(2))
    stored, created = store.add_report(
        Report("default", [a, b], score=1.0, feedback="good")
    ).result()
    assert created
    assert stored["references"] == [a, b]
    for record_id in (a, b):
        record = store.get_record(record_id)
        assert record is not None
        assert [r["score"] for r in record["reports"]] == [1.0]


def test_report_with_the_same_id_and_content_is_returned_not_duplicated(
    store: ExperienceStore,
) -> None:
    record_id = store.add_record(_record()).result()
    first, created = store.add_report(Report("default", [record_id], score=0.5, id="r-1")).result()
    again, created_again = store.add_report(
        Report("default", [record_id], score=0.5, id="r-1")
    ).result()
    assert created and not created_again
    assert again == first
    record = store.get_record(record_id)
    assert record is not None and len(record["reports"]) == 1


def test_report_id_reused_with_other_content_conflicts(store: ExperienceStore) -> None:
    record_id = store.add_record(_record()).result()
    store.add_report(Report("default", [record_id], score=0.5, id="r-2")).result()
    with pytest.raises(ReportConflict):
        store.add_report(Report("default", [record_id], score=0.9, id="r-2")).result()


def test_report_on_unknown_or_other_scenario_records_is_refused(store: ExperienceStore) -> None:
    record_id = store.add_record(_record(scenario="a")).result()
    with pytest.raises(UnknownRecords) as error:
        store.add_report(Report("b", [record_id], score=1.0)).result()
    assert error.value.missing == [record_id]
    with pytest.raises(UnknownRecords):
        store.add_report(Report("a", [record_id, "rec_missing"], score=1.0)).result()
    assert store.get_record(record_id)["reports"] == []  # type: ignore[index]


def test_a_failing_write_does_not_undo_its_neighbours(store: ExperienceStore) -> None:
    record_id = store.add_record(_record()).result()
    bad = store.add_report(Report("default", ["rec_missing"], score=1.0))
    good = store.add_report(Report("default", [record_id], score=1.0))
    with pytest.raises(UnknownRecords):
        bad.result()
    assert good.result()[1] is True


def test_stats_count_per_scenario(store: ExperienceStore) -> None:
    a = store.add_record(_record(scenario="a")).result()
    store.add_record(_record(scenario="b")).result()
    store.add_report(Report("a", [a], feedback={"label": "ok"})).result()
    stats = store.stats()
    assert stats["scenarios"] == {
        "a": {"records": 1, "reports": 1},
        "b": {"records": 1, "reports": 0},
    }
    assert stats["size_bytes"] > 0


def test_score_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        Report("default", ["rec_x"], score=float("nan"))


def test_a_record_built_on_the_writer_thread_keeps_its_raw_json(
    sqlite_store: ExperienceStore,
) -> None:
    sent = '{"messages": [ {"role": "user", "content": "hi"} ]}'
    built: list[str] = []

    def build() -> Record:
        built.append(threading.current_thread().name)
        return dataclasses.replace(_record(), request_json=sent)

    record_id = sqlite_store.add_record(build).result()
    assert built == ["reef-store-writer"]
    raw = sqlite3.connect(sqlite_store.path).execute("SELECT request FROM records").fetchone()[0]
    assert raw == sent
    assert sqlite_store.get_record(record_id)["request"] == json.loads(sent)  # type: ignore[index]


def _noting_thread(built: list[str], text: str) -> Callable[[], Record]:
    """A record builder that appends the name of the thread it runs on to `built`."""

    def build() -> Record:
        built.append(threading.current_thread().name)
        return _record(text=text)

    return build


def test_a_record_alone_is_committed_on_the_callers_thread(sqlite_store: ExperienceStore) -> None:
    """With the writer idle, `alone` commits here: the future is resolved on return, the row is
    on disk for another connection, and no thread hand-off happened."""
    built: list[str] = []
    build = _noting_thread(built, "alone")
    future = sqlite_store.add_record(build, alone=True)
    assert future.done()
    assert built == [threading.current_thread().name]
    other = sqlite3.connect(sqlite_store.path)
    assert other.execute("SELECT id FROM records").fetchall() == [(future.result(),)]


def test_a_record_alone_waits_its_turn_while_the_writer_is_busy(store: ExperienceStore) -> None:
    """While a group runs on the writer's connection, `alone` is queued like any write, so the
    caller's thread never uses the connection at the same time as the writer's."""
    release = threading.Event()
    running = threading.Event()

    def slow(db: object) -> None:
        running.set()
        release.wait(10)

    busy = store.write(slow)
    assert running.wait(10)
    built: list[str] = []
    build = _noting_thread(built, "queued")
    future = store.add_record(build, alone=True)
    assert not future.done()
    release.set()
    busy.result(10)
    assert future.result(10)
    assert built == ["reef-store-writer"]


def test_add_record_async_alone_returns_the_committed_id(store: ExperienceStore) -> None:
    record_id = asyncio.run(store.add_record_async(_record(text="async"), alone=True))
    stored = store.get_record(record_id)
    assert stored is not None
    assert stored["request"]["messages"][0]["content"] == "async"


def test_a_record_alone_goes_to_the_writer_while_another_process_writes(
    sqlite_store: ExperienceStore,
) -> None:
    """Another process holding the write lock must not block the caller's thread (the server's
    event loop): the record is queued, and the writer thread commits it once the lock is free."""
    other = sqlite3.connect(sqlite_store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # as a learning worker's write would
    built: list[str] = []
    build = _noting_thread(built, "after the lock")
    future = sqlite_store.add_record(build, alone=True)
    assert not future.done()
    other.execute("COMMIT")
    record_id = future.result(10)
    assert built == ["reef-store-writer"]
    assert sqlite_store.get_record(record_id) is not None


def test_a_record_alone_on_a_closed_store_fails_its_future(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path / "experience.db")
    store.close()
    future = store.add_record(_record(), alone=True)
    with pytest.raises(StoreClosed):
        future.result(5)
