"""Python scorers referenced as `tests.support.scorers:NAME` from eval task files."""

from __future__ import annotations

from typing import Any


def explode(answer: str, task: Any) -> float:
    raise RuntimeError("this scorer always fails")


def short(answer: str, task: Any) -> bool:
    return len(answer) <= 30
