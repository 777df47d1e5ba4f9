"""The thread count of each llama_decode: the fastest lately, re-measured now and then, with
timings scripted (what is checked is the choice, not the machine)."""

from __future__ import annotations

import itertools

from reef.threads import FIRST_RETRY, LAST_RETRY, ThreadChoice, thread_counts


def run(choice: ThreadChoice, calls: int, seconds: dict[int, float], kind: object = 1) -> list[int]:
    """`calls` calls of `kind`, each taking what `seconds` says for its count; the counts used."""
    used = []
    for _ in range(calls):
        count = choice.threads_for(kind)
        choice.took(kind, count, seconds[count])
        used.append(count)
    return used


def test_the_counts_are_the_configured_one_halved_down_to_one() -> None:
    assert thread_counts(8) == [8, 4, 2, 1]
    assert thread_counts(2) == [2, 1]
    assert thread_counts(1) == [1]
    assert ThreadChoice(4, adaptive=False).counts == [4]


def test_a_quiet_machine_keeps_every_thread_and_looks_again_ever_more_rarely() -> None:
    choice = ThreadChoice(2)
    used = run(choice, 4000, {2: 0.010, 1: 0.016})
    assert used[:2] == [2, 1]  # each measured once
    ones = [n for n, count in enumerate(used) if count == 1]
    gaps = [b - a for a, b in itertools.pairwise(ones)]
    assert gaps[0] == FIRST_RETRY + 1 and max(gaps) == LAST_RETRY + 1  # doubling, then capped
    assert used.count(1) < 12  # of 4000 calls


def test_a_busy_core_moves_the_calls_to_one_thread_and_back_when_it_is_free() -> None:
    choice = ThreadChoice(2)
    run(choice, 200, {2: 0.010, 1: 0.016})
    busy = run(choice, 100, {2: 0.050, 1: 0.018})  # another process took a core
    assert busy[2:].count(1) >= 95  # within two calls, and two threads looked at again twice
    quiet = run(choice, 200, {2: 0.010, 1: 0.016})  # the core is free again
    back = quiet.index(2)
    # Back on two threads, one looked at again after 16, 32, 64 calls.
    assert back <= FIRST_RETRY * 4 and quiet[back:].count(1) == 3


def test_each_kind_of_call_is_timed_on_its_own() -> None:
    choice = ThreadChoice(2)
    steps = run(choice, 100, {2: 0.010, 1: 0.016}, kind=1)  # one sequence: two threads win
    blocks = run(choice, 100, {2: 0.030, 1: 0.020}, kind="prompt block")  # here one does
    assert steps.count(2) > 95 and blocks.count(1) > 95


def test_with_a_margin_more_threads_must_be_that_much_faster() -> None:
    within = run(ThreadChoice(2, margin=0.15), 100, {2: 0.100, 1: 0.110})  # 10% faster
    assert within[2:].count(1) >= 95  # one thread: the other core goes back to whoever wants it
    beyond = run(ThreadChoice(2, margin=0.15), 100, {2: 0.060, 1: 0.100})  # 40% faster
    assert beyond[2:].count(2) >= 95
