"""Waiting on a server in the test's process for what it will do by itself (follow a head, answer
a shadow copy), with a deadline instead of a sleep."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Return once `condition()` holds; fail the test past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.05)


def release_serving(url: str, scenario: str = "default") -> str | None:
    """The release the server at `url` serves on `scenario` now (None before any call)."""
    return httpx.get(f"{url}/reef/status").json()["serving"].get(scenario)
