"""The store's tests run on both databases: a SQLite file, and a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.store import ExperienceStore


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a fresh store lives: a file, or an empty PostgreSQL database."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return tmp_path / "experience.db"


@pytest.fixture
def store(store_location: Path | str) -> Iterator[ExperienceStore]:
    with ExperienceStore(store_location) as opened:
        yield opened


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[ExperienceStore]:
    """For what only SQLite does: WAL files, other sqlite3 connections, commits on the caller's
    thread."""
    with ExperienceStore(tmp_path / "experience.db") as opened:
        yield opened
