"""What serves is one snapshot with one writer (`reef.server.serving_now`): swaps and failures
from threads released together are never lost (each used to replace a shared dict built from
the one it read), a call reads one snapshot, and the state's views of it cannot be written."""

from __future__ import annotations

import sys
import threading

import pytest

from reef.inference.binding import BASE_BINDING, Binding
from reef.server.serving_now import ServingNow

THREADS = 16


def release(scenario: str) -> Binding:
    return Binding(release_id=f"{scenario}@1", kind="harness", system_prompt=scenario)


def at_once(work: list[threading.Thread]) -> None:
    for thread in work:
        thread.start()
    for thread in work:
        thread.join()


def test_swaps_from_threads_released_together_are_all_kept() -> None:
    # Threads switch every microsecond: a read-then-replace without the lock loses updates.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    serving = ServingNow()
    gate = threading.Barrier(THREADS)

    def swap(n: int) -> None:
        gate.wait()
        for round_ in range(200):
            serving.swap(f"s{n}", release(f"s{n}"))
            serving.failed(f"s{n}", f"broken {round_}")
            serving.recovered(f"s{n}")

    try:
        at_once([threading.Thread(target=swap, args=(n,)) for n in range(THREADS)])
    finally:
        sys.setswitchinterval(interval)
    now = serving.snapshot
    assert sorted(now.bindings) == sorted(f"s{n}" for n in range(THREADS))
    assert dict(now.errors) == {}


def test_a_snapshot_is_what_it_was_when_read() -> None:
    serving = ServingNow()
    before = serving.snapshot
    assert serving.swap("default", release("default")) is None
    assert before.binding("default") is BASE_BINDING  # a call that read it is served as it read
    assert serving.snapshot.binding("default").release_id == "default@1"
    assert serving.failed("default", "head cannot serve") is True
    assert serving.failed("default", "head cannot serve") is False  # said once
    with pytest.raises(TypeError):
        serving.snapshot.bindings["other"] = release("other")  # type: ignore[index]
