"""Opening the stores under real concurrency: many processes at once, on a new state folder and
on an existing one; and what remains an error says what to do."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reef.errors import ReefError
from reef.releases.chain import ReleaseChain
from reef.store import ExperienceStore

PROCESSES = 8

# Each process imports everything first, says it is ready, then waits for the word to go, so
# that all of them open the stores in the same instant.
OPEN_BOTH = """
import sys
from pathlib import Path
from reef.store.candidates import CandidateStore
from reef.releases.chain import ReleaseChain
from reef.store import ExperienceStore

state = Path(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
with ExperienceStore(state / "experience.db") as store:
    CandidateStore(store).list()
chain = ReleaseChain(state / "releases.git")
print("opened", chain.scenarios(), flush=True)
"""


def open_at_once(state: Path) -> list[tuple[int, str, str]]:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_BOTH, str(state)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    for run in runs:
        assert run.stdout is not None and run.stdout.readline().strip() == "ready"
    for run in runs:
        assert run.stdin is not None
        run.stdin.write("go\n")
        run.stdin.flush()
    outcomes = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        outcomes.append((run.returncode, out, err))
    return outcomes


def test_many_processes_open_new_and_existing_stores_at_once(tmp_path: Path) -> None:
    for round_number in range(3):
        state = tmp_path / f"new-{round_number}" / ".reef"
        for code, out, err in open_at_once(state):
            assert code == 0 and "opened []" in out, f"round {round_number} (new): {err}"
    existing = tmp_path / "new-0" / ".reef"
    for round_number in range(2):
        for code, out, err in open_at_once(existing):
            assert code == 0 and "opened []" in out, f"round {round_number} (existing): {err}"
    mode = sqlite3.connect(existing / "experience.db").execute("PRAGMA journal_mode").fetchone()
    assert mode == ("wal",)


def test_a_store_locked_too_long_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "experience.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(ReefError, match="locked by another process") as error:
            ExperienceStore(path, busy_timeout_s=0.3)
        assert str(path) in error.value.message
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "experience.db"
    path.write_bytes(b"this is not sqlite, " * 100)
    with pytest.raises(ReefError, match="cannot open the experience store") as error:
        ExperienceStore(path)
    assert str(path) in error.value.message


def test_a_chain_path_that_is_not_a_repository_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "releases.git").mkdir()
    (tmp_path / "releases.git/notes.txt").write_text("not git")
    with pytest.raises(ReefError, match="not a git repository"):
        ReleaseChain(tmp_path / "releases.git")
