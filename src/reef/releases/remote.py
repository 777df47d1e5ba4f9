"""A release chain shared through a git remote, for replicas on several machines.

`releases.remote` is any URL git speaks (`file:///srv/reef/releases.git` in tests, `ssh://`,
`https://` in production), with Git LFS for weight files. Each process keeps its own bare
repository (`.reef/releases.git`) as a copy of the remote:

- publishing fetches the remote's heads first, commits the release, pushes its LFS objects and
  then, atomically, its head and release refs; only once the remote took them do the local refs
  move. The chain is append-only, so a publisher that started from a stale head makes a push
  that is not a fast-forward: the remote refuses it and the publisher gets the same
  `ReleaseConflict` as on one machine, naming the head it missed; nothing local moved;
- following fetches the remote's refs into `refs/reef-remote/` and moves each local head only
  forward, to a descendant of what it was (with the LFS objects of the new heads). A local head
  the remote does not descend from (a chain made before the remote was set) is never replaced:
  status names it (`diverged`) until its releases are pushed. A replica that cannot reach the
  remote keeps serving what it has and says so (`RemoteState`).

The URL reaches git through its environment (`GIT_CONFIG_*`, as remote `reef-shared`), never
its command line, where other users of the machine could read a token in it. A user and
password (or token) in an http(s) URL never reach git as part of the URL, which git would pass on
to its helper on the command line (`git-remote-https reef-shared URL`) at every poll: git gets
the URL without them, and they come from a credential helper, set for that URL alone in the
same environment, that writes them from two variables of git's environment (`REEF_GIT_USERNAME`,
`REEF_GIT_PASSWORD`, readable only by this user in /proc); the helpers of the user's own git
configuration are not asked for, nor given (`store`), that URL's credentials. The processes
sharing one local copy (a server, its learning worker, a `reef` command) take turns with a file
lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from reef.errors import ReefError
from reef.urls import masked, without_password

REMOTE = "reef-shared"  # the remote's name for git, defined in the environment of each call
HEADS = "refs/reef/*/head"
MIRROR = "refs/reef-remote"  # where the remote's refs land before local heads move forward
LOOK_TIMEOUT_S = 30.0  # ls-remote, ref updates
TRANSFER_TIMEOUT_S = 1800.0  # a push or fetch of LFS objects may be gigabytes
# The credential helper of a URL that carried its credentials: git runs it with `sh -c`, so its
# command line is this text, which names the variables and not their values (`read` and `printf`
# are the shell's own, no process of their own). It answers `get` only; `store` and `erase`
# are no-ops.
CREDENTIAL_HELPER = (
    '!f() { while read -r _; do :; done; if [ "$1" = get ]; then '
    'printf \'username=%s\\npassword=%s\\n\' "$REEF_GIT_USERNAME" "$REEF_GIT_PASSWORD"; fi; }; f'
)


class RemoteUnreachable(ReefError):
    """The release remote could not be read or written; the message says which and why."""

    status = 503
    code = "release_remote_unreachable"


class PushRefused(Exception):
    """The remote refused a push: another publisher moved the head first."""


@dataclass
class RemoteState:
    """What a process knows of its remote, for `/reef/status` (never the URL's password)."""

    shown_url: str
    reachable: bool | None = None  # None: not tried yet
    last_fetch_at: float | None = None
    error: str | None = None
    diverged: list[str] = field(default_factory=list)  # scenarios whose local head stays

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.shown_url,
            "reachable": self.reachable,
            "last_fetch_at": self.last_fetch_at,
            "error": self.error,
            "diverged": self.diverged,
        }


class ReleaseRemote:
    """The git remote of one local bare repository (`repository`)."""

    def __init__(self, repository: Path, url: str) -> None:
        self.repository = Path(repository)
        self._url = url
        self.shown = without_password(url)  # for messages and status
        self.state = RemoteState(self.shown)
        git_url, credentials = split_credentials(url)
        config = [(f"remote.{REMOTE}.url", git_url)]
        if credentials is not None:
            origin = git_url.split("://", 1)[0] + "://" + urlsplit(git_url).netloc
            config += [
                (f"credential.{origin}.helper", ""),  # empty: the user's helpers are not asked
                (f"credential.{origin}.helper", CREDENTIAL_HELPER),
            ]
        self._environment = {
            **os.environ,
            "GIT_CONFIG_COUNT": str(len(config)),
            "GIT_TERMINAL_PROMPT": "0",  # a missing credential is an error, not a prompt
        }
        for index, (key, value) in enumerate(config):
            self._environment[f"GIT_CONFIG_KEY_{index}"] = key
            self._environment[f"GIT_CONFIG_VALUE_{index}"] = value
        if credentials is not None:
            self._environment["REEF_GIT_USERNAME"], self._environment["REEF_GIT_PASSWORD"] = (
                credentials
            )
        self._fetched_heads: dict[str, str] | None = None  # the remote's, at the last catch-up
        self._lfs_fetched: set[str] = set()  # heads whose LFS objects are here
        self._lfs_missing: set[str] = set()  # heads whose LFS objects could not be fetched yet
        self._turn = threading.RLock()
        self._depth = 0
        self._lock_file: int | None = None

    @property
    def behind(self) -> bool:
        """Whether the last fetch left something to fetch again (LFS objects of a head)."""
        return bool(self._lfs_missing)

    def heads(self) -> dict[str, str]:
        """The remote's scenario heads (scenario -> commit), with one `git ls-remote`."""
        output = self._git(LOOK_TIMEOUT_S, "ls-remote", REMOTE, HEADS)
        heads = {}
        for line in output.splitlines():
            sha, _, ref = line.partition("\t")
            parts = ref.split("/")
            if len(parts) == 4:
                heads[parts[2]] = sha
        return heads

    def catch_up(self, local_heads: dict[str, str]) -> bool:
        """Fetch if a remote head differs from `local_heads` and has moved since the last fetch
        (a diverged local head is not fetched for again and again), or a fetch left LFS objects
        behind; whether it fetched."""
        try:
            remote_heads = self.heads()
        except RemoteUnreachable as error:
            self.state.reachable, self.state.error = False, error.message
            raise
        differ = any(local_heads.get(name) != sha for name, sha in remote_heads.items())
        if not self.behind and (not differ or remote_heads == self._fetched_heads):
            self.state.reachable, self.state.error = True, None
            return False
        self.fetch()
        self._fetched_heads = remote_heads
        return True

    def fetch(self) -> None:
        """Fetch the remote's refs and move each local head forward to the remote's, with the
        LFS objects of the heads (a local head the remote does not descend from stays)."""
        with self.turn():
            try:
                self._git(
                    TRANSFER_TIMEOUT_S, "fetch", "--quiet", "--prune", REMOTE,
                    f"+refs/reef/*:{MIRROR}/*",
                )  # fmt: skip
                self.state.diverged = self._move_forward()
                self._fetch_lfs()
            except RemoteUnreachable as error:
                self.state.reachable, self.state.error = False, error.message
                raise
        self.state.reachable, self.state.error = True, None
        self.state.last_fetch_at = time.time()

    def push(
        self,
        commit: str,
        refs: list[str],
        expected: dict[str, str | None] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> None:
        """Push `commit`'s LFS objects, then `refs` (all pointing at it) in one atomic push;
        `PushRefused` when the remote's head moved meanwhile. `expected` gives a ref's old value
        on the remote (None: it must not exist), sent as `--force-with-lease`, so a publisher
        with a stale view can never overwrite what another pushed. `fence()` runs after the
        LFS objects went (the long part) and right before the refs go: it raises to stop.

        A push git reports as failed may have landed (a time-out or a dropped connection after
        the remote took it, a failing mirror update): before saying it failed, the remote is
        asked (`landed`), and a push that landed is a push that succeeded.

        The LFS upload (up to half an hour of weights) runs outside the copy's turn, which it
        does not need (no ref of the copy moves): the other processes sharing the copy (the
        server's follower) keep catching up with the remote meanwhile."""
        if _has_lfs():  # without it, no commit of this chain has LFS objects
            self._push_lfs(commit)
        with self.turn():
            if fence is not None:
                fence()
            leases = [
                f"--force-with-lease={ref}:{old or ''}" for ref, old in (expected or {}).items()
            ]
            pushed = [f"{commit}:{ref}" for ref in refs]
            result = self._run(
                TRANSFER_TIMEOUT_S, "push", "--quiet", "--atomic", *leases, REMOTE, *pushed
            )
            if result.returncode != 0:
                text = self._said(result)
                refused = ("rejected", "non-fast-forward", "fetch first", "stale info")
                if any(word in text for word in refused):
                    raise PushRefused(text)
                if not self.landed(commit, refs[0]):
                    raise RemoteUnreachable(
                        f"cannot push to the release remote {self.shown}: {text}"
                    )
            try:
                for ref in refs:  # the mirror knows what the remote has now
                    mirror = ref.replace("refs/reef", MIRROR, 1)
                    self._git(LOOK_TIMEOUT_S, "update-ref", mirror, commit)
            except RemoteUnreachable:
                if not self.landed(commit, refs[0]):
                    raise

    def landed(self, commit: str, ref: str) -> bool:
        """Whether the remote's `ref` is `commit` or a descendant of it (another replica
        published on top since): asked of the remote itself. Raises `RemoteUnreachable` when
        the remote cannot say: then nobody knows yet, and nothing may be decided."""
        output = self._git(LOOK_TIMEOUT_S, "ls-remote", REMOTE, ref)
        remote = next((line.split("\t", 1)[0] for line in output.splitlines() if line), None)
        if remote is None:
            return False
        if remote == commit:
            return True
        self._git(
            TRANSFER_TIMEOUT_S, "fetch", "--quiet", REMOTE, f"+refs/reef/*:{MIRROR}/*"
        )  # the commits between, to tell whether the remote's head descends from ours
        return self._descends(remote, commit)

    def _push_lfs(self, commit: str) -> None:
        """The LFS objects of `commit` and its ancestors the remote lacks. git-lfs reads the
        local refs, and a new copy may have none yet (nothing moves here before the push):
        a ref of its own names the commit meanwhile."""
        pending = f"refs/reef-pending/{commit}"
        self._git(LOOK_TIMEOUT_S, "update-ref", pending, commit)
        try:
            self._git(TRANSFER_TIMEOUT_S, "lfs", "push", REMOTE, commit)
        finally:
            self._run(LOOK_TIMEOUT_S, "update-ref", "-d", pending)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Held while refs of the local copy change for the remote: by one thread of one
        process at a time, across the processes sharing the copy."""
        with self._turn:
            if self._depth == 0:
                self._lock_file = os.open(
                    self.repository / "reef-remote.lock", os.O_CREAT | os.O_RDWR
                )
                fcntl.flock(self._lock_file, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_file is not None:
                    os.close(self._lock_file)  # closing releases the lock
                    self._lock_file = None

    # -- moving the local copy forward ----------------------------------------------------------

    def _move_forward(self) -> list[str]:
        """Each local head moved to the remote's where that is a step forward (or new); each
        release ref the remote has and this copy lacks, added. The scenarios left behind."""
        local = self._refs("refs/reef")
        remote = self._refs(MIRROR)
        diverged = []
        for ref, sha in sorted(remote.items()):
            mine = local.get(ref)
            if mine == sha:
                continue
            if ref.endswith("/head"):
                if mine is not None and not self._descends(sha, mine):
                    diverged.append(ref.split("/")[2])
                    continue
                self._git(LOOK_TIMEOUT_S, "update-ref", ref, sha, mine or "0" * 40)
            elif mine is None:
                self._git(LOOK_TIMEOUT_S, "update-ref", ref, sha, "0" * 40)
        return diverged

    def _fetch_lfs(self) -> None:
        if not _has_lfs():
            return
        heads = {sha for ref, sha in self._refs("refs/reef").items() if ref.endswith("/head")}
        self._lfs_missing |= heads - self._lfs_fetched
        for sha in sorted(self._lfs_missing):
            self._git(TRANSFER_TIMEOUT_S, "lfs", "fetch", REMOTE, sha)
            self._lfs_missing.discard(sha)
            self._lfs_fetched.add(sha)

    def _descends(self, commit: str, ancestor: str) -> bool:
        result = self._run(LOOK_TIMEOUT_S, "merge-base", "--is-ancestor", ancestor, commit)
        return result.returncode == 0

    def _refs(self, prefix: str) -> dict[str, str]:
        """Refs under `prefix`, named as under refs/reef (ref -> sha)."""
        output = self._git(
            LOOK_TIMEOUT_S, "for-each-ref", "--format=%(refname) %(objectname)", prefix
        )
        refs = {}
        for line in output.splitlines():
            ref, _, sha = line.partition(" ")
            refs["refs/reef" + ref[len(prefix) :]] = sha
        return refs

    # -- running git --------------------------------------------------------------------------

    def _git(self, timeout: float, *args: str) -> str:
        result = self._run(timeout, *args)
        if result.returncode != 0:
            raise RemoteUnreachable(
                f"the release remote {self.shown} could not be reached (git {args[0]}: "
                f"{self._said(result)}): this process keeps serving the releases it has"
            )
        return result.stdout

    def _said(self, result: subprocess.CompletedProcess[str]) -> str:
        """What git said, without the URL's password."""
        return masked(result.stderr.strip(), self._url)

    def _run(self, timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
        """git `args` in the local copy; on a timeout, git and its helpers (ssh, git-lfs,
        git-remote-https) are stopped together."""
        process = subprocess.Popen(
            ["git", *args],
            cwd=self.repository,
            env=self._environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return subprocess.CompletedProcess(args, 1, "", f"no answer within {timeout:.0f} s")
        return subprocess.CompletedProcess(args, process.returncode, out, err)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """An http(s) URL without its user and password, and them (percent-decoded; a user alone is
    a token, with an empty password); any other URL as it is (an ssh user is no secret)."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return url, None
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    bare = urlunsplit(parts._replace(netloc=host))
    return bare, (unquote(user or ""), unquote(password or ""))


def _has_lfs() -> bool:
    return shutil.which("git-lfs") is not None
