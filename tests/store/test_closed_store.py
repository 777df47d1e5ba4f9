"""Writes to a closed experience store fail at once, with an error that says so, and never wait:
nobody is left to commit them (a worker's write after the server closed the store hung, and with
it `reef learn`, which then could not exit on Ctrl-C)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import pytest

from reef.errors import ReefError
from reef.store import ExperienceStore, Record, Report

BOUND_S = 10  # far longer than any commit here; a write left pending waits forever


def _record() -> Record:
    return Record(
        scenario="default",
        session=None,
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "hello"}}]},
        engine="test",
        release_id="base",
    )


def _closed(tmp_path: Path) -> ExperienceStore:
    store = ExperienceStore(tmp_path / "experience.db")
    store.close()
    return store


def _writes(store: ExperienceStore) -> dict[str, Callable[[], Future[Any]]]:
    report = Report(scenario="default", references=["rec_x"], score=1.0)
    return {
        "write": lambda: store.write(lambda db: db.execute("SELECT 1").fetchone()),
        "add_record": lambda: store.add_record(_record()),
        "add_record alone": lambda: store.add_record(_record(), alone=True),
        "add_report": lambda: store.add_report(report),
    }


def _assert_refused_as_closed(error: BaseException | None, store: ExperienceStore) -> None:
    assert isinstance(error, ReefError), repr(error)
    assert error.status == 503
    assert "closed" in error.message and str(store.path) in error.message


@pytest.mark.parametrize("kind", ["write", "add_record", "add_record alone", "add_report"])
def test_a_write_after_close_has_already_failed(tmp_path: Path, kind: str) -> None:
    store = _closed(tmp_path)
    future = _writes(store)[kind]()
    assert future.done(), "a write to a closed store was left waiting for a commit"
    _assert_refused_as_closed(future.exception(), store)


def test_an_awaited_write_after_close_raises(tmp_path: Path) -> None:
    store = _closed(tmp_path)

    async def add() -> str:
        return await asyncio.wait_for(store.add_record_async(_record()), BOUND_S)

    with pytest.raises(ReefError) as refused:
        asyncio.run(add())
    _assert_refused_as_closed(refused.value, store)


def test_writes_racing_close_are_committed_or_refused_never_left_waiting(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path / "experience.db")
    futures: list[Future[str]] = []
    some_submitted = threading.Event()

    def keep_writing(alone: bool) -> None:
        for count in range(400):
            futures.append(store.add_record(_record(), alone=alone))
            if count == 20:
                some_submitted.set()

    writers = [threading.Thread(target=keep_writing, args=(i % 2 == 0,)) for i in range(4)]
    for writer in writers:
        writer.start()
    assert some_submitted.wait(BOUND_S)
    store.close()
    for writer in writers:
        writer.join(BOUND_S)
    _, pending = wait(futures, timeout=BOUND_S)
    assert not pending, f"{len(pending)} of {len(futures)} writes never resolved"
    errors = [future.exception() for future in futures]
    assert any(error is None for error in errors), "no write was committed before the close"
    for error in errors:
        if error is not None:
            _assert_refused_as_closed(error, store)


def test_writes_queued_before_close_are_committed(tmp_path: Path) -> None:
    path = tmp_path / "experience.db"
    store = ExperienceStore(path)
    futures = [store.add_record(_record()) for _ in range(50)]
    store.close()
    ids = [future.result(BOUND_S) for future in futures]
    with ExperienceStore(path) as reopened:
        assert all(reopened.record_exists(record_id) for record_id in ids)
