"""A measurement in a process of its own, as `reef serve` loads one model: a model timed after
others in one process ran up to half as fast, in no fixed pattern."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def in_own_process(function: Any, *args: Any) -> Any:
    """`function(*args)` in a fresh spawned process; its result."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()
