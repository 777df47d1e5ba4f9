"""Replicas racing on one store: two `ExperienceStore`s (each a replica's writer, on its own
connection) do the same thing at the same moment, on SQLite and on a real PostgreSQL server.

Under PostgreSQL's read committed a read followed by a write is no compare-and-set: two writers
both read the old state, then both write. To make the interleaving certain rather than likely, a
third connection holds a lock on the row the racers touch while a `threading.Barrier` releases
them, and lets go once both wait for it (PostgreSQL shows them waiting in `pg_stat_activity`).
On SQLite the holder takes the database's write lock: the racers queue behind it and behind
each other, which is the answer both databases must give."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reef.errors import Conflict
from reef.store import ExperienceStore, Record, Report, ReportConflict
from reef.store.candidates import Candidate, CandidateStore
from reef.store.database import is_postgres
from reef.store.learning import fingerprint, queue_instruction, take_instruction


def _record(text: str = "hi") -> Record:
    return Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"{text}!"}}]},
        engine="test",
        release_id="base",
    )


@contextmanager
def replicas(location: Path | str, n: int = 2) -> Iterator[list[ExperienceStore]]:
    """`n` stores on one database, as `n` replicas open it (busy timeout: a hung test fails)."""
    stores: list[ExperienceStore] = []
    try:
        for _ in range(n):
            stores.append(ExperienceStore(location, busy_timeout_s=20))
        yield stores
    finally:
        for store in stores:
            store.close()


@contextmanager
def holding(location: Path | str, row_lock_sql: str, params: list[Any]) -> Iterator[None]:
    """A third connection holds a lock the racers need until the block ends: on PostgreSQL the
    row lock `row_lock_sql` takes (the racers' plain reads pass it, their writes wait), on
    SQLite the write lock."""
    if is_postgres(location):
        import psycopg

        with psycopg.connect(str(location), autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute(row_lock_sql, params)
            try:
                yield
            finally:
                conn.execute("COMMIT")
    else:
        conn = sqlite3.connect(location, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                conn.execute("COMMIT")
        finally:
            conn.close()


def waiting_on_locks(location: Path | str, n: int) -> None:
    """Return once `n` connections wait for a lock (PostgreSQL shows them; SQLite's wait in
    their busy handler, unseen: give them a moment)."""
    if not is_postgres(location):
        time.sleep(0.5)
        return
    import psycopg

    deadline = time.monotonic() + 20
    with psycopg.connect(str(location), autocommit=True) as conn:
        while time.monotonic() < deadline:
            (waiting,) = conn.execute(
                "SELECT COUNT(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting >= n:
                return
            time.sleep(0.02)
    raise AssertionError(f"{n} writers never waited for the held lock")


def race(
    location: Path | str, lock_sql: str, params: list[Any], *racers: Callable[[], Any]
) -> list[tuple[str, Any]]:
    """Release `racers` at once (each on its own thread) while the row is held, let go once
    they all wait, and return each one's ("ok", value) or ("error", exception)."""
    barrier = threading.Barrier(len(racers) + 1)
    outcomes: list[tuple[str, Any]] = [("error", None)] * len(racers)

    def run(i: int, racer: Callable[[], Any]) -> None:
        barrier.wait(10)
        try:
            outcomes[i] = ("ok", racer())
        except Exception as error:
            outcomes[i] = ("error", error)

    threads = [threading.Thread(target=run, args=item) for item in enumerate(racers)]
    with holding(location, lock_sql, params):
        for thread in threads:
            thread.start()
        barrier.wait(10)
        waiting_on_locks(location, len(racers))
    for thread in threads:
        thread.join(30)
    return outcomes


def test_two_replicas_moving_one_candidate_at_once_one_gets_a_conflict(
    store_location: Path | str,
) -> None:
    with replicas(store_location) as (a, b):
        made = CandidateStore(a).add(Candidate("default", "harness", "/tmp/c", None))
        outcomes = race(
            store_location,
            "SELECT 1 FROM candidates WHERE id = %s FOR UPDATE",
            [made.id],
            lambda: CandidateStore(a).move(made.id, ("proposed",), "released"),
            lambda: CandidateStore(b).move(made.id, ("proposed",), "rejected", reason="no"),
        )
        won = [value for kind, value in outcomes if kind == "ok"]
        lost = [value for kind, value in outcomes if kind == "error"]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert isinstance(lost[0], Conflict) and lost[0].code == "candidate_state"
        # The state is the winner's, and the winner was told the state it made.
        assert CandidateStore(a).get(made.id).state == won[0].state


@pytest.mark.parametrize("same_body", [True, False], ids=["retry", "other_body"])
def test_one_report_id_sent_to_two_replicas_at_once(
    store_location: Path | str, same_body: bool
) -> None:
    """A retry reaching another replica gets the stored report back, whichever commits first;
    a different body under the same id is a conflict (409), never a database error (500)."""
    with replicas(store_location) as (a, b):
        record_id = a.add_record(_record()).result()
        first = Report("default", [record_id], score=1.0, id="rep_retried")
        second = Report("default", [record_id], score=1.0 if same_body else 0.0, id=first.id)
        outcomes = race(
            store_location,
            "SELECT 1 FROM records WHERE id = %s FOR UPDATE",
            [record_id],
            lambda: a.add_report(first).result(),
            lambda: b.add_report(second).result(),
        )
        stored = a.query("SELECT score FROM reports WHERE id = ?", [first.id])
        assert len(stored) == 1
        answers = [value for kind, value in outcomes if kind == "ok"]
        errors = [value for kind, value in outcomes if kind == "error"]
        if same_body:
            assert not errors, outcomes
            assert sorted(created for _, created in answers) == [False, True]
            assert answers[0][0] == answers[1][0]  # the same stored report, to both
        else:
            assert len(answers) == 1 and answers[0][1] is True, outcomes
            assert len(errors) == 1 and isinstance(errors[0], ReportConflict), outcomes
            assert stored[0]["score"] == answers[0][0]["score"]


def test_two_workers_taking_instructions_at_once_take_different_ones(
    store_location: Path | str,
) -> None:
    with replicas(store_location) as (a, b):
        queue_instruction(a, "default", "be brief")
        queue_instruction(a, "default", "be kind")
        (oldest,) = a.query("SELECT MIN(seq) AS seq FROM train_requests")
        outcomes = race(
            store_location,
            "SELECT 1 FROM train_requests WHERE seq = %s FOR UPDATE",
            [oldest["seq"]],
            lambda: take_instruction(a, "default"),
            lambda: take_instruction(b, "default"),
        )
        assert sorted(value for _, value in outcomes) == ["be brief", "be kind"], outcomes
        assert take_instruction(a, "default") is None


def test_a_record_that_commits_late_is_seen_by_a_reader_that_paged_past_later_ones(
    store_location: Path | str,
) -> None:
    """Replica A takes a record's place in the order and holds its transaction open; replica B
    stores a record meanwhile; a reader pages (`after=`) and watches the learner's fingerprint;
    then A commits. Paging on from where it stopped, the reader sees A's record, and the
    fingerprint changes."""
    with replicas(store_location, 3) as (a, b, reader):
        start = a.add_record(_record("start")).result()
        busy, release_busy = threading.Event(), threading.Event()
        building, release_build = threading.Event(), threading.Event()

        def occupy(db: object) -> None:
            busy.set()
            release_busy.wait(10)

        def slow_record() -> Record:  # built on A's writer, inside the transaction
            building.set()
            release_build.wait(10)
            return _record("slow")

        # A's writer is busy, so that the next two records share its next transaction: the
        # first takes its place, the second keeps the transaction open while it is built.
        occupied = a.write(occupy)
        assert busy.wait(10)
        early = _record("early")
        early_done: Future[str] = a.add_record(early)
        slow_done: Future[str] = a.add_record(slow_record)
        release_busy.set()
        occupied.result(10)
        assert building.wait(10)

        other = _record("other replica")
        other_done = b.add_record(other)
        wait([other_done], timeout=1.5)  # B's commit, where it does not wait for A's

        def page(after: str) -> list[str]:
            return [r["id"] for r in reader.list_records("default", after=after, limit=100)]

        seen = page(start)
        before = fingerprint(reader, "default")
        release_build.set()
        slow_id = slow_done.result(10)
        assert early_done.result(10) == early.id and other_done.result(10) == other.id
        seen += page(seen[-1] if seen else start)
        assert sorted(seen) == sorted([early.id, slow_id, other.id])
        assert fingerprint(reader, "default") != before


def test_a_report_that_commits_late_still_changes_the_learners_fingerprint(
    store_location: Path | str,
) -> None:
    """Replica A stores a report and keeps its transaction open; replica B stores one (a higher
    `seq`) and commits; the learner looks; then A commits: the learner must notice."""
    with replicas(store_location) as (a, b):
        record_id = a.add_record(_record()).result()
        busy, release_busy = threading.Event(), threading.Event()
        holding_open, release_hold = threading.Event(), threading.Event()

        def occupy(db: object) -> None:
            busy.set()
            release_busy.wait(10)

        def hold_open(db: object) -> None:
            holding_open.set()
            release_hold.wait(10)

        occupied = a.write(occupy)
        assert busy.wait(10)
        late = a.add_report(Report("default", [record_id], score=1.0))
        held = a.write(hold_open)  # in the same transaction as the report, after it
        release_busy.set()
        occupied.result(10)
        assert holding_open.wait(10)
        other = b.add_report(Report("default", [record_id], score=0.0))
        wait([other], timeout=1.5)  # B's commit (on SQLite it waits for A's write lock)
        before = fingerprint(b, "default")
        release_hold.set()
        late.result(10)
        held.result(10)
        other.result(10)
        assert fingerprint(b, "default") != before
