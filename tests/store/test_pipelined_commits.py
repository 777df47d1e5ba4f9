"""A group of record inserts on PostgreSQL (one record or many) goes in one pipeline, one round
trip, and a failing record still fails alone: the pipelined transaction is rolled back and the
group runs again, each record in its savepoint. On SQLite, which has no round trips to save,
groups never pipeline."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from reef.store import ExperienceStore, Record

GROUP = 6


def record(number: int, record_id: str | None = None) -> Record:
    made = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": f"question {number}"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "answer"}}]},
        engine="test",
        release_id="base",
        tags={"n": str(number)},
    )
    if record_id is not None:
        made.id = record_id
    return made


def in_one_group(store: ExperienceStore, records: list[Record]) -> list[Future[str]]:
    """`records` queued while the writer is held by a job that waits: they commit as one group."""
    holding, release = threading.Event(), threading.Event()

    def hold(db: object) -> None:
        holding.set()
        assert release.wait(30)

    first = store.write(hold)
    assert holding.wait(30)
    futures = [store.add_record(r) for r in records]
    release.set()
    first.result(30)
    for future in futures:
        future.exception(30)  # settled, whichever way
    return futures


def test_a_group_of_records_commits_in_one_pipeline_on_postgresql(
    store: ExperienceStore,
) -> None:
    futures = in_one_group(store, [record(n) for n in range(GROUP)])
    ids = [future.result() for future in futures]
    assert all(store.get_record(i) is not None for i in ids)
    assert store.get_record(ids[3])["metadata"]["tags"] == {"n": "3"}  # type: ignore[index]
    pipelined = store._writer.stats.pipelined
    assert pipelined == (1 if store.dialect == "postgresql" else 0)


def test_a_failing_record_in_a_pipelined_group_fails_alone(store: ExperienceStore) -> None:
    taken = store.add_record(record(0)).result()
    pipelined_before = store._writer.stats.pipelined  # on PostgreSQL, that one record's
    records = [record(n) for n in range(1, GROUP)]
    records.insert(2, record(99, record_id=taken))  # its id is taken: the insert fails
    futures = in_one_group(store, records)
    failed = [f for f in futures if f.exception() is not None]
    assert len(failed) == 1 and futures.index(failed[0]) == 2
    stored = [f.result() for f in futures if f.exception() is None]
    assert len(stored) == GROUP - 1 and all(store.get_record(i) is not None for i in stored)
    # It fell back to one savepoint per record.
    assert store._writer.stats.pipelined == pipelined_before
    assert (
        "duplicate" in str(failed[0].exception()).lower()
        or "unique" in str(failed[0].exception()).lower()
    )


def test_a_pipelined_group_keeps_its_records_in_order_with_their_tags(
    store: ExperienceStore,
) -> None:
    """Each table's rows of a group go in one statement: the records still number in the order
    they were submitted, and each keeps its own tags."""
    futures = in_one_group(store, [record(n) for n in range(GROUP)])
    ids = [future.result() for future in futures]
    stored = store.list_records(limit=GROUP)
    assert [r["id"] for r in stored] == ids
    assert [r["metadata"]["tags"] for r in stored] == [{"n": str(n)} for n in range(GROUP)]


def test_a_record_that_cannot_be_built_fails_alone_and_the_rest_still_pipeline(
    store: ExperienceStore,
) -> None:
    def broken() -> Record:
        raise ValueError("this response cannot be encoded")

    pipelined_before = store._writer.stats.pipelined
    holding, release = threading.Event(), threading.Event()
    first = store.write(lambda db: (holding.set(), release.wait(30)))
    assert holding.wait(30)
    futures = [store.add_record(record(0)), store.add_record(broken), store.add_record(record(2))]
    release.set()
    first.result(30)
    assert isinstance(futures[1].exception(30), ValueError)
    assert all(store.get_record(futures[i].result(30)) is not None for i in (0, 2))
    expected = 1 if store.dialect == "postgresql" else 0
    assert store._writer.stats.pipelined == pipelined_before + expected
