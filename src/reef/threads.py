"""How many CPU threads a repeated piece of work runs with: the count that is fastest right now.

Two callers: each llama_decode of the llama.cpp engine, and each step of a training run.

llama.cpp splits every matrix product over its threads, which meet at a barrier after each
operation, hundreds of times a token (torch's OpenMP threads do the same in each operation of a
step). On a quiet machine two threads on two cores decode about 1.6x faster than one. But when
another process holds a core (a build, a browser, a test run, the server beside a training run),
the thread that lost its core makes the other wait at every barrier, and two threads decode
slower than one would: on a 2-core machine with one core busy, a fifth of the quiet speed with
two threads, more than half with one.

So the caller times its calls: `ThreadChoice` keeps, for each kind of call (a prompt block, a
decode step of b sequences, a training step), the duration under each thread count it may use
(the configured count, halved down to one: a moving average for the count in use, the latest
measurement for the others), and gives every call the count that is fastest for its kind. The
other counts are measured again now and then: after 16 calls of the kind, then, each time one is
confirmed slower, after twice as many, up to 1024 (about ten seconds of decoding); when one
turns out faster, it is chosen and the intervals start again. On a quiet machine that costs a
slower call in a thousand; a busy one moves to fewer threads within a few calls, and back within
seconds of the core coming free.

With a `margin`, more threads must be that much faster to be chosen (0.15: 15% faster): a
training run beside a server gives the server its core back when a second thread buys the run
little.
"""

from __future__ import annotations

import os
from collections.abc import Hashable

FIRST_RETRY = 16  # calls of a kind before a count not chosen is measured again
LAST_RETRY = 1024  # the longest such interval, reached by doubling
SMOOTHING = 0.3  # weight of the newest duration in the chosen count's moving average


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container or `taskset` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_counts(most: int) -> list[int]:
    """The counts a choice is made from: `most`, halved down to one (8 -> 8, 4, 2, 1)."""
    counts = [most]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


class ThreadChoice:
    def __init__(self, most: int, adaptive: bool = True, margin: float = 0.0) -> None:
        self.counts = thread_counts(most) if adaptive else [most]
        self.margin = margin
        self._seconds: dict[tuple[Hashable, int], float] = {}  # (kind, count) -> average
        self._measured_at: dict[tuple[Hashable, int], int] = {}  # (kind, count) -> call number
        self._retry: dict[tuple[Hashable, int], int] = {}  # (kind, count) -> calls between
        self._calls: dict[Hashable, int] = {}  # kind -> calls so far

    def threads_for(self, kind: Hashable) -> int:
        """The thread count for the next call of `kind`: one due to be measured again, else
        the fastest."""
        calls = self._calls.get(kind, 0)
        for count in self.counts:
            key = (kind, count)
            measured = self._measured_at.get(key)
            if measured is None or calls - measured >= self._retry.get(key, FIRST_RETRY):
                return count
        return self._fastest(kind)

    def took(self, kind: Hashable, count: int, seconds: float) -> None:
        """Record that a call of `kind` with `count` threads took `seconds`."""
        key = (kind, count)
        chosen = self._fastest(kind) if self._known(kind) else None
        previous = self._seconds.get(key)
        if previous is None or count != chosen:  # a count measured again: its average is stale
            self._seconds[key] = seconds
        else:
            self._seconds[key] = SMOOTHING * seconds + (1 - SMOOTHING) * previous
        calls = self._calls.get(kind, 0) + 1
        self._calls[kind] = calls
        self._measured_at[key] = calls
        if chosen is None or count == chosen:
            return
        if self._fastest(kind) == count:  # the other count is faster now: start over
            for other in self.counts:
                self._retry.pop((kind, other), None)
        else:  # confirmed slower: look again later
            self._retry[key] = min(LAST_RETRY, 2 * self._retry.get(key, FIRST_RETRY))

    def _known(self, kind: Hashable) -> bool:
        return all((kind, count) in self._seconds for count in self.counts)

    def _fastest(self, kind: Hashable) -> int:
        """The fewest threads within `margin` of the quickest count's time."""
        seconds = {count: self._seconds[(kind, count)] for count in self.counts}
        best = min(seconds.values())
        return min(count for count, took in seconds.items() if took <= best * (1 + self.margin))
