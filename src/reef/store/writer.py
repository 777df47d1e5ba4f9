"""The experience store's one writer: write jobs on one connection, committed in groups.

A thread takes every queued job, runs each in its own savepoint and commits them together:
concurrent callers share one commit (one fsync), a failing job does not undo its neighbours, and
each caller's future resolves only once the commit holding its row has finished.

A caller with nobody to share a commit with (the only request a server has in flight) may ask
for its job to run on its own thread instead, when the writer is idle: that saves the two thread
hand-offs (about 0.1 ms each on two cores) and blocks the caller only for its own commit: if
another process holds the database's write lock, the job goes to the writer thread, which waits.
(Only SQLite offers that: on PostgreSQL a commit is a round trip, never made on a caller's thread.)

On PostgreSQL every statement is a round trip, three per job with its savepoint and three more
per group, so a group of jobs that only insert rows (records and their tags: `Inserts`), one
job or many, goes first in one pipeline, without savepoints, and each table's rows of the whole
group in one prepared statement (`Database.insert_many`): begin, the inserts and commit sent
together, one round trip and one fsync for the group. If anything in it fails, that
transaction is rolled back whole and the group runs again the usual way, each job in its
savepoint, so a failing job still fails alone.

Once the writer is stopped, a job submitted fails at once (`StoreClosed`): nobody would ever
commit it, and its caller must not wait for it.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from reef.errors import ReefError
from reef.store.database import Database

T = TypeVar("T")


class StoreClosed(ReefError):
    """A write submitted after the experience store was closed: it was not stored."""

    status = 503
    code = "store_closed"


@dataclass
class Inserts:
    """What a job that only inserts rows writes, table by table in the order given, and what
    its caller gets back once they are committed."""

    rows: list[tuple[str, dict[str, Any]]]
    value: Any = None

    def apply(self, db: Database) -> Any:
        for table, row in self.rows:
            db.insert(table, row)
        return self.value


@dataclass
class _Job:
    work: Callable[[Database], Any]
    # It inserts records: its transaction must commit in `seq` order (`Database.begin_write`).
    ordered: bool = False
    # It only inserts rows, built by this (on the thread that commits): see `submit_inserts`.
    inserts: Callable[[], Inserts] | None = None
    future: Future[Any] = field(default_factory=Future)


# A commit's wall time, in seconds (from its first job to its commit), and how many jobs
# one commit holds: the buckets `/metrics` shows them in.
COMMIT_SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
GROUP_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Buckets:
    """A histogram kept as plain numbers: cumulative counts per upper bound, a sum and a count.
    Observed by one thread at a time (the writer holds its connection lock), read by any."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
                break
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound, observations at or below it), +Inf last: Prometheus' bucket shape."""
        running, out = 0, []
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


class WriterStats:
    """What the writer did: commits (wall time, jobs per commit), jobs stored, failed commits
    (the store unavailable). Counted on the thread that commits, under the connection lock."""

    def __init__(self) -> None:
        self.commit_seconds = Buckets(COMMIT_SECONDS_BUCKETS)
        self.group_size = Buckets(GROUP_SIZE_BUCKETS)
        self.unavailable = 0  # commits that failed: the store could not be written
        self.pipelined = 0  # groups committed in one pipeline (PostgreSQL's row inserts)


class GroupCommitWriter(threading.Thread):
    """Runs write jobs on one connection, many per transaction, each in its own savepoint."""

    max_group = 256

    def __init__(self, db: Database) -> None:
        super().__init__(name="reef-store-writer", daemon=True)
        self._db = db
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        # Held while a group runs on the connection, by this thread or by a caller's.
        self._connection = threading.Lock()
        # Held to queue a job and to queue the stop: no job is ever queued behind the stop.
        self._accepting = threading.Lock()
        self._closed = False
        self.stats = WriterStats()

    def submit(
        self, work: Callable[[Database], T], here: bool = False, ordered: bool = False
    ) -> Future[T]:
        """Queue `work`; the future resolves once the commit holding it is done, or at once
        with `StoreClosed` once the writer is stopped.

        `here`: run it now on the calling thread, in a transaction of its own, if no job is
        queued, no group is running and no other process holds the database's write lock (the
        future is then already resolved); else queue it. `ordered`: it inserts records, so its
        transaction commits in `seq` order with every other process's
        (`Database.begin_write`)."""
        return self._submitted(_Job(work, ordered), here)

    def submit_inserts(
        self, build: Callable[[], Inserts], here: bool = False, ordered: bool = False
    ) -> Future[Any]:
        """`submit` for a job that only inserts rows, which `build` makes (where the job is
        committed: on the writer thread, or on the caller's when `here`). The future resolves
        to their `value`. Such jobs may share one pipeline and one statement per table (see the
        module's docstring)."""
        once = functools.cache(build)  # built once, if the group runs again in savepoints
        return self._submitted(_Job(lambda db: once().apply(db), ordered, once), here)

    def _submitted(self, job: _Job, here: bool) -> Future[Any]:
        if here and self._ran_here(job):
            return job.future
        self._enqueue(job)
        return job.future

    def _ran_here(self, job: _Job) -> bool:
        """Whether `job` ran on the calling thread (see `submit`)."""
        if not self._jobs.empty() or not self._connection.acquire(blocking=False):
            return False
        try:
            return not self._closed and self._commit_here(job)
        finally:
            self._connection.release()

    def _enqueue(self, job: _Job) -> None:
        with self._accepting:
            if not self._closed:
                self._jobs.put(job)
                return
        job.future.set_exception(self._closed_error())

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(
            f"the experience store {self._db.name} is closed (its process is shutting down), so "
            "this write was not stored: write before closing it, or open the store again"
        )

    def _commit_here(self, job: _Job) -> bool:
        """Run `job` in a transaction of its own if one can begin now; False when another
        process holds the write lock: the caller must not wait for it (the writer thread does,
        up to the busy timeout)."""
        try:
            if not self._db.begin_write_now():
                return False
        except BaseException as error:  # a closed store: the caller gets the error, as queued
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)
            return True
        if job.future.set_running_or_notify_cancel():
            self._finish([job])
        else:  # its caller gave up: nothing to write
            self._roll_back()
        return True

    def stop(self) -> None:
        """Refuse new jobs, commit those already queued, and return once no job runs: neither
        on the writer thread nor on a caller's (`here`)."""
        with self._accepting:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self.join()
        with self._connection:  # a caller's own commit, begun before the stop, ends first
            pass

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
        # A job whose caller already gave up is dropped: nobody waits for its row.
        live = [job for job in group if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        pipelinable = self._db.pipelines and all(job.inserts is not None for job in live)
        if pipelinable:
            live = self._built(live)
            if not live or self._committed_in_one_pipeline(live):
                return
        try:
            self._db.begin_write(ordered=any(job.ordered for job in live))
        except BaseException as error:
            self.stats.unavailable += 1
            for job in live:
                job.future.set_exception(self._db.unavailable(error))
            return
        self._finish(live)

    def _built(self, live: list[_Job]) -> list[_Job]:
        """The insert jobs of `live` whose rows could be built; a job whose `build` raised
        fails alone, with that error."""
        built = []
        for job in live:
            try:
                job.inserts()  # type: ignore[misc]
            except Exception as error:
                job.future.set_exception(error)
            else:
                built.append(job)
        return built

    def _committed_in_one_pipeline(self, live: list[_Job]) -> bool:
        """Insert the rows of `live` as one transaction in one pipeline, without savepoints,
        one `insert_many` per table and set of columns; whether it committed. False (everything
        rolled back) when anything failed: the caller runs them again, each in its savepoint,
        and the one that fails fails alone."""
        inserts = [job.inserts() for job in live]  # type: ignore[misc]
        started = time.perf_counter()
        try:
            with self._db.pipelined():
                self._db.begin_write(ordered=any(job.ordered for job in live))
                for (table, _), rows in _by_table(inserts).items():
                    self._db.insert_many(table, rows)
                self._db.commit()
        except Exception:
            self._roll_back()
            return False
        self.stats.commit_seconds.observe(time.perf_counter() - started)
        self.stats.group_size.observe(len(live))
        self.stats.pipelined += 1
        for job, done in zip(live, inserts, strict=True):
            job.future.set_result(done.value)
        return True

    def _finish(self, live: list[_Job]) -> None:
        """Run the jobs inside the transaction already begun, commit, resolve their futures."""
        outcomes: list[tuple[Any, BaseException | None]] = []
        started = time.perf_counter()
        try:
            for job in live:
                outcomes.append(self._in_savepoint(job))
            self._db.commit()
        except BaseException as error:  # the transaction failed: no row of this group is durable
            self.stats.unavailable += 1
            self._roll_back()
            for job in live:
                job.future.set_exception(self._db.unavailable(error))
            return
        self.stats.commit_seconds.observe(time.perf_counter() - started)
        self.stats.group_size.observe(len(live))
        for job, (value, job_error) in zip(live, outcomes, strict=True):
            if job_error is None:
                job.future.set_result(value)
            else:
                job.future.set_exception(job_error)

    def _roll_back(self) -> None:
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except Exception:  # the connection is gone: so is its transaction
            pass

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


def _by_table(inserts: list[Inserts]) -> dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]]:
    """Every job's rows, gathered by table and columns, each table where it first appears (a
    record before its tags) and its rows in the jobs' order (records in `seq` order)."""
    gathered: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
    for done in inserts:
        for table, row in done.rows:
            gathered.setdefault((table, tuple(row)), []).append(row)
    return gathered
