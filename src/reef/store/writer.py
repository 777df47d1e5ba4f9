"""The experience store's one writer: write jobs on one connection, committed in groups.

A thread takes every queued job, runs each in its own savepoint and commits them together:
concurrent callers share one commit (one fsync), a failing job does not undo its neighbours, and
each caller's future resolves only once the commit holding its row has finished.

A caller with nobody to share a commit with (the only request a server has in flight) may ask
for its job to run on its own thread instead, when the writer is idle: that saves the two thread
hand-offs (about 0.1 ms each on two cores) and blocks the caller only for its own commit: if
another process holds the database's write lock, the job goes to the writer thread, which waits.
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

    def __init__(self, db: sqlite_utils.Database) -> None:
        super().__init__(name="reef-store-writer", daemon=True)
        self._db = db
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        # Held while a group runs on the connection, by this thread or by a caller's.
        self._connection = threading.Lock()
        self._busy_timeout_ms = int(db.conn.execute("PRAGMA busy_timeout").fetchone()[0])

    def submit(self, work: Callable[[sqlite_utils.Database], T], here: bool = False) -> Future[T]:
        """Queue `work`; the future resolves once the commit holding it is done.

        `here`: run it now on the calling thread, in a transaction of its own, if no job is
        queued, no group is running and no other process holds the database's write lock (the
        future is then already resolved); else queue it."""
        job = _Job(work)
        if here and self._jobs.empty() and self._connection.acquire(blocking=False):
            try:
                ran_here = self._commit_here(job)
            finally:
                self._connection.release()
            if ran_here:
                return job.future
        self._jobs.put(job)
        return job.future

    def _commit_here(self, job: _Job) -> bool:
        """Run `job` in a transaction of its own if the database's write lock is free now;
        False when another process holds it: the caller must not wait for it (the writer
        thread does, up to the busy timeout)."""
        connection = self._db.conn
        try:
            connection.execute("PRAGMA busy_timeout = 0")
            try:
                connection.execute("BEGIN IMMEDIATE")
            finally:
                connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        except sqlite3.OperationalError:  # locked (or failing): the writer thread deals with it
            return False
        except BaseException as error:  # a closed store: the caller gets the error, as queued
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)
            return True
        self._finish([job])
        return True

    def stop(self) -> None:
        self._jobs.put(None)
        self.join()

    def run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            group, stopping = self._group(first)
            with self._connection:
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
