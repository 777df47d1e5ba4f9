"""The sandbox, its limits and untrusted tasks: every test here needs bubblewrap
(tests/support/sandbox.py)."""

from __future__ import annotations

import pytest

from tests.support.sandbox import require_bwrap


@pytest.fixture(scope="session", autouse=True)
def bwrap() -> None:
    require_bwrap()
