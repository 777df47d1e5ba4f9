"""The experience store's one writer: write jobs on one connection, committed in groups.

A thread takes every queued job, runs each in its own savepoint and commits them together:
concurrent callers share one commit (one fsync), a failing job does not undo its neighbours, and
each caller's future resolves only once the commit holding its row has finished.

A caller with nothing to share a commit with (`run_now`: the server's only request in flight)
may commit on its own thread instead, while the writer is idle: the same transaction and fsync,
without the two thread hand-offs (queue, then result) that cost about 0.1 ms on a busy machine.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlite_utils

T = TypeVar("T")


@dataclass
class _Job:
    work: Callable[[sqlite_utils.Database], Any]
    future: Future[Any] = field(default_factory=Future)


class GroupCommitWriter(threading.Thread):
    """Runs write jobs on one connection, many per transaction, each in its own savepoint."""

    max_group = 256

    def __init__(self, db: sqlite_utils.Database, busy_timeout_s: float) -> None:
        super().__init__(name="reef-store-writer", daemon=True)
        self._db = db
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._connection = threading.Lock()  # held while a group runs, here or in run_now

    def submit(self, work: Callable[[sqlite_utils.Database], T]) -> Future[T]:
        job = _Job(work)
        self._jobs.put(job)
        return job.future

    def run_now(self, work: Callable[[sqlite_utils.Database], T]) -> Future[T] | None:
        """Run `work` in a transaction of its own on the calling thread, finished when this
        returns; None, without running it, when the writer is busy or another process holds the
        database's lock (a thread serving others must not wait for that: submit it instead)."""
        if not self._jobs.empty() or not self._connection.acquire(blocking=False):
            return None
        try:
            if not self._begin_without_waiting():
                return None
            job = _Job(work)
            self._finish([job])
            return job.future
        finally:
            self._connection.release()

    def stop(self) -> None:
        self._jobs.put(None)
        self.join()

    def run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            with self._connection:
                group, stopping = self._group(first)
                self._commit(group)
            if stopping:
                return

    def _group(self, first: _Job) -> tuple[list[_Job], bool]:
        """`first` and every job queued behind it; whether a stop was queued among them."""
        group = [first]
        while len(group) < self.max_group:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return group, True
            group.append(job)
        return group, False

    def _begin_without_waiting(self) -> bool:
        self._db.execute("PRAGMA busy_timeout = 0")
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if "locked" in str(error):
                return False
            raise
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        return True

    def _commit(self, group: list[_Job]) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException as error:
            for job in group:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(error)
            return
        self._finish(group)

    def _finish(self, group: list[_Job]) -> None:
        """Run the jobs inside the transaction already begun, commit, resolve their futures."""
        # A job whose caller already gave up is dropped: nobody waits for its row.
        live = [job for job in group if job.future.set_running_or_notify_cancel()]
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            for job in live:
                outcomes.append(self._in_savepoint(job))
            self._db.execute("COMMIT")
        except BaseException as error:  # the transaction failed: no row of this group is durable
            if self._db.conn.in_transaction:
                self._db.execute("ROLLBACK")
            for job in live:
                job.future.set_exception(error)
            return
        for job, (value, job_error) in zip(live, outcomes, strict=True):
            if job_error is None:
                job.future.set_result(value)
            else:
                job.future.set_exception(job_error)

    def _in_savepoint(self, job: _Job) -> tuple[Any, BaseException | None]:
        self._db.execute("SAVEPOINT job")
        try:
            value = job.work(self._db)
        except Exception as error:
            self._db.execute("ROLLBACK TO job")
            self._db.execute("RELEASE job")
            return None, error
        self._db.execute("RELEASE job")
        return value, None
