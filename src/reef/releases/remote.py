"""A release chain shared through a git remote, for replicas on several machines.

`releases.remote` is any URL git speaks (`file:///srv/reef/releases.git` in tests, `ssh://`,
`https://` in production), with Git LFS for weight files. Each process keeps its own bare
repository (`.reef/releases.git`) as a copy of the remote:

- publishing fetches the remote's heads first, appends locally (the local compare-and-swap), then
  pushes the release's LFS objects and, atomically, its head and release refs. The chain is
  append-only, so a publisher that started from a stale head makes a push that is not a
  fast-forward: the remote refuses it, the local head goes back, and the publisher gets the same
  `ReleaseConflict` as on one machine, naming the head it missed;
- following fetches the remote's refs (and the LFS objects of their heads) into the local copy,
  where the server's head follower finds them and switches what it serves. A replica that cannot
  reach the remote keeps serving what it has and says so (`RemoteState`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass

from reef.errors import ReefError
from reef.urls import without_password

HEADS = "refs/reef/*/head"
TIMEOUT_S = 60.0


class RemoteUnreachable(ReefError):
    """The release remote could not be read or written; the message says which and why."""

    status = 503
    code = "release_remote_unreachable"


class PushRefused(Exception):
    """The remote refused a push: another publisher moved the head first."""


@dataclass
class RemoteState:
    """What a process knows of its remote, for `/reef/status`."""

    url: str
    reachable: bool | None = None  # None: not tried yet
    last_fetch_at: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "url": without_password(self.url),
            "reachable": self.reachable,
            "last_fetch_at": self.last_fetch_at,
            "error": self.error,
        }


class ReleaseRemote:
    """The git remote of one local bare repository (`repository`)."""

    def __init__(self, repository: str, url: str) -> None:
        self.repository = repository
        self.url = url
        self.shown = without_password(url)  # for messages and status: never a password
        self.state = RemoteState(url)

    def heads(self) -> dict[str, str]:
        """The remote's scenario heads (scenario -> commit), with one `git ls-remote`."""
        output = self._git("ls-remote", self.url, HEADS)
        heads = {}
        for line in output.splitlines():
            sha, _, ref = line.partition("\t")
            heads[ref.split("/")[2]] = sha
        return heads

    def fetch(self) -> None:
        """Make the local copy's refs the remote's (the remote is the authority: a local head
        it does not have goes away), with the LFS objects of each head."""
        try:
            self._git("fetch", "--quiet", "--prune", self.url, "+refs/reef/*:refs/reef/*")
            for ref in self._local_heads() if _has_lfs() else ():
                self._git("lfs", "fetch", self.url, ref)
        except RemoteUnreachable as error:
            self.state.reachable, self.state.error = False, error.message
            raise
        self.state.reachable, self.state.error = True, None
        self.state.last_fetch_at = time.time()

    def push(self, commit: str, refs: list[str]) -> None:
        """Push `commit`'s LFS objects, then `refs` (all pointing at it) in one atomic push;
        `PushRefused` when the remote's head moved meanwhile (not a fast-forward)."""
        if _has_lfs():  # without it, no commit of this chain has LFS objects
            self._git("lfs", "push", self.url, commit)
        result = self._run(
            "push", "--quiet", "--atomic", self.url, *(f"{commit}:{r}" for r in refs)
        )
        if result.returncode != 0:
            text = self._said(result)
            if "rejected" in text or "non-fast-forward" in text or "fetch first" in text:
                raise PushRefused(text)
            raise RemoteUnreachable(f"cannot push to the release remote {self.shown}: {text}")

    def _local_heads(self) -> list[str]:
        output = self._git("for-each-ref", "--format=%(refname)", HEADS)
        return output.split()

    def _git(self, *args: str) -> str:
        result = self._run(*args)
        if result.returncode != 0:
            raise RemoteUnreachable(
                f"the release remote {self.shown} could not be reached (git {args[0]}: "
                f"{self._said(result)}): this process keeps serving the releases it has"
            )
        return result.stdout

    def _said(self, result: subprocess.CompletedProcess[str]) -> str:
        """What git said, without the URL's password."""
        return result.stderr.strip().replace(self.url, self.shown)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["git", *args],
                cwd=self.repository,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, 1, "", f"no answer within {TIMEOUT_S:.0f} s")


def _has_lfs() -> bool:
    return shutil.which("git-lfs") is not None
