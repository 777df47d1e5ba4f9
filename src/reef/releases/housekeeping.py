"""The release workflow's housekeeping: its folders pruned, and whether an evaluation still runs.

The workflow writes two kinds of folder under the state folder, neither a source of truth (the
store and the chain are): `.reef/candidates/ID`, a candidate's files from its proposal on, and
`.reef/checkouts/RELEASE`, a release's files checked out once to serve. Both are pruned after a
decision or a checkout, as `retention` says, and pruning never fails what triggered it.

A candidate being evaluated records the process gating it (its pid and host), so that
`evaluator_running` can tell an evaluation still under way from one whose process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from reef.config import ReefConfig
from reef.releases.chain import ReleaseChain
from reef.store.candidates import Candidate, CandidateStore

log = logging.getLogger("reef.releases")

# A candidate folder without its row is a proposal being written, unless it is this old.
UNFINISHED_PROPOSAL_S = 3600.0


class Housekeeping:
    """Prunes the folders of decided candidates and of releases no longer served."""

    def __init__(self, config: ReefConfig, chain: ReleaseChain, candidates: CandidateStore) -> None:
        self.config = config
        self.chain = chain
        self.candidates = candidates
        self.checkouts = config.state_dir / "checkouts"
        self.candidate_folders = config.state_dir / "candidates"

    def prune_candidates(self) -> None:
        """Keep the folders of open candidates and of the `retention.candidates` newest decided
        ones; remove the other decided ones, and folders of proposals that never got a row."""
        with _housekeeping("candidate folders"):
            open_ids = self.candidates.open_ids()
            decided = self.candidates.decided_ids()
            keep = open_ids | set(decided[: self.config.retention.candidates])
            known = open_ids | set(decided)
            for folder in _subfolders(self.candidate_folders):
                if folder.name in keep:
                    continue
                if folder.name in known or _age(folder) > UNFINISHED_PROPOSAL_S:
                    shutil.rmtree(folder, ignore_errors=True)

    def prune_checkouts(self) -> None:
        """Keep the checkouts of every scenario's head and of the releases open candidates are
        evaluated against, and the `retention.checkouts` most recently used others."""
        with _housekeeping("release checkouts"):
            heads = (self.chain.head(scenario) for scenario in self.chain.scenarios())
            keep = {head.release_id for head in heads if head is not None}
            keep |= self.candidates.open_base_release_ids()
            others = [f for f in _subfolders(self.checkouts) if f.name not in keep]
            for folder in _newest_first(others)[self.config.retention.checkouts :]:
                shutil.rmtree(folder, ignore_errors=True)


def mark_used(folder: Path) -> None:
    """A checkout served again: the most recently used are the ones pruning keeps."""
    with contextlib.suppress(OSError):
        os.utime(folder)


@contextlib.contextmanager
def _housekeeping(what: str) -> Iterator[None]:
    """Pruning must never fail the decision or the checkout that triggered it."""
    try:
        yield
    except Exception as error:
        log.warning("could not prune %s: %s", what, error)


def _subfolders(folder: Path) -> list[Path]:
    """The folders directly inside, without hidden ones (checkouts being written)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]


def _newest_first(folders: list[Path]) -> list[Path]:
    """By last use (modification time), then by release number; a folder removed meanwhile by
    another process is left out."""
    dated = []
    for folder in folders:
        with contextlib.suppress(FileNotFoundError):
            number = folder.name.rpartition("@")[2]
            dated.append(
                (folder.stat().st_mtime_ns, int(number) if number.isdigit() else 0, folder)
            )
    return [folder for *_, folder in sorted(dated, key=lambda d: d[:2], reverse=True)]


def _age(folder: Path) -> float:
    try:
        return time.time() - folder.stat().st_mtime
    except FileNotFoundError:
        return 0.0


# -- evaluator liveness ---------------------------------------------------------------------------


def evaluator_running(candidate: Candidate) -> bool:
    """Whether the process that moved `candidate` to evaluating still runs. A pid is reused
    once its process is gone, so a process started after the evaluation began is another one;
    a pid of another machine (a replica elsewhere) cannot be checked, so it counts as running."""
    pid = candidate.evaluating_pid
    if pid is None:  # evaluated by a Reef that did not record pids
        return False
    if candidate.evaluating_host not in (None, socket.gethostname()):
        return True  # another replica's machine: its pid cannot be checked from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    state, started = _process_state(pid)
    if state == "Z":  # exited, not yet reaped by its parent
        return False
    return started is None or started <= candidate.updated_at + 1.0  # boot time is in seconds


def _process_state(pid: int) -> tuple[str | None, float | None]:
    """A process's state letter and start time (seconds since the epoch), from /proc where
    there is one; (None, None) elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None, None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
