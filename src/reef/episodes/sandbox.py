"""One episode's sandbox: bubblewrap over the host's tools, with one writable folder.

The episode's folder on the host (a `Workspace`, workspace.py) is mapped as Harbor maps a
task's container: `/app` (the work folder, the task's `environment/` files copied in), `/logs`
(writable), `/tests` (read-only, for the verifier only), plus `/home/agent` and `/tmp`, all
inside that folder. The host's `/usr` and a few files of `/etc` are read-only; the network
namespace is empty but for Reef's port, relayed (relay.py). As root, the sandbox runs as a uid
of its own, so process limits count its processes alone.

Limits (`Limits`): wall time, CPU time, memory, processes and disk written stop the run and are
named in `SandboxResult.limit`; output past its cap is dropped and flagged. Memory, processes
and CPU share are kept by the kernel in a cgroup of the run's own where this machine allows
(cgroups.py), and disk by the workspace's size-capped tmpfs as root; `enforcement()` names the
limits that hold only by polling here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from reef.episodes.relay import OutsideRelay
from reef.episodes.seccomp import SeccompUnavailable, filter_fd
from reef.episodes.supervision import Limits, SandboxResult, supervise
from reef.episodes.untrusted import as_uid
from reef.episodes.workspace import INSIDE_UID, Workspace

SandboxMode = Literal["bwrap", "none"]
EPISODES_PACKAGE = Path(__file__).resolve().parent
INSIDE_PACKAGE = "/opt/reef"  # this package's files, read-only, for the relay and native agent
SOCKET_INSIDE = "/run/reef/reef.sock"
# Host /etc files a shell, Python, Node and git need; nothing else of /etc is visible.
HOST_ETC = (
    "alternatives",
    "ca-certificates",
    "ssl",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "bash.bashrc",
    "profile",
    "inputrc",
    "gitconfig",
)


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here, and `episodes.sandbox: none` was not chosen."""


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run a sandbox here, or None when it can."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    try:
        seccomp = filter_fd()  # as every sandbox has it: a kernel that refuses it is said here
    except SeccompUnavailable as error:
        return error.message
    try:
        flags = ["--unshare-all", "--die-with-parent", "--seccomp", str(seccomp)]
        probe = subprocess.run(
            [binary, *_system_binds(), *flags, "true"],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(seccomp,),
        )
    finally:
        os.close(seccomp)
    if probe.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()[:300]}"
    return None


def require_sandbox(mode: SandboxMode) -> None:
    """Refuse to run episodes without bubblewrap unless `episodes.sandbox: none` was chosen."""
    if mode == "none":
        return
    problem = bwrap_problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"cannot run episodes: {problem}. Install bubblewrap, or set `episodes.sandbox: none` "
            "in reef.yaml (or pass --sandbox none) to run agents unconfined, on the host itself"
        )


@dataclass
class Sandbox:
    """Runs commands in a workspace under limits; `reef_port` is the one port reachable."""

    workspace: Workspace
    limits: Limits = field(default_factory=Limits)
    reef_port: int | None = None
    # Read-only folders, inside -> host: /tests for the verifier, /solution for the oracle.
    mounts: dict[str, Path] = field(default_factory=dict)
    readonly: list[Path] = field(default_factory=list)  # host paths visible at the same path
    mode: SandboxMode = "bwrap"

    def run(self, command: list[str], env: dict[str, str]) -> SandboxResult:
        """Run `command` (its paths as seen inside) with `env` added to a minimal environment."""
        full_env = {**base_env(), **env}
        if self.mode == "none":
            return supervise(command, full_env, self.workspace, self.limits, cwd=self.workspace.app)
        seccomp = filter_fd()  # no user namespaces inside (reef.episodes.seccomp)
        try:
            return self._run_bwrap(command, full_env, seccomp)
        finally:
            os.close(seccomp)

    def _run_bwrap(self, command: list[str], env: dict[str, str], seccomp: int) -> SandboxResult:
        space, limits, kept = self.workspace, self.limits, (seccomp,)
        if self.reef_port is None:
            return supervise(self._bwrap(command, None, seccomp), env, space, limits, keep_fds=kept)
        # A socket's path is at most 107 bytes: its folder is a short one of its own.
        with tempfile.TemporaryDirectory(prefix="reef-", dir="/tmp") as folder:
            sockets = Path(folder)
            if space.uid is not None:
                os.chown(sockets, space.uid, space.uid)
            with OutsideRelay(sockets / "reef.sock", self.reef_port, owner=space.uid):
                args = self._bwrap(command, sockets, seccomp)
                return supervise(args, env, space, limits, keep_fds=kept)

    def _bwrap(self, command: list[str], sockets: Path | None, seccomp: int) -> list[str]:
        binds = [*_system_binds(), *self._workspace_binds(sockets)]
        readonly: list[str] = []
        for host, inside in self._readonly_paths().items():
            readonly += ["--ro-bind", str(host), inside]
        # The read-only paths' folders are made after the workspace is bound: a Python under
        # /tmp (a virtual environment there) is then reached through the episode's own /tmp,
        # where a folder made before would be hidden by it, and one made by bubblewrap's bind
        # alone would be root's, closed to the agent.
        args = [shutil.which("bwrap") or "bwrap", *_parent_folders(binds), *binds]
        args += [*_parent_folders(readonly), *readonly]
        # Every namespace but the user's (`_identity` decides that one): --unshare-all would
        # also try a user namespace, in which the uid `as_uid` takes does not exist.
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        args += ["--hostname", "episode", "--seccomp", str(seccomp)]
        args += [*self._identity(), "--chdir", "/app", "--"]
        if self.workspace.uid is not None:
            args += as_uid(self.workspace.uid)
        if self.reef_port is not None:
            args += [python_path(), f"{INSIDE_PACKAGE}/relay.py", SOCKET_INSIDE]
            args += [str(self.reef_port), "--"]
        return args + command

    def _identity(self) -> list[str]:
        """As root, bubblewrap sets up the sandbox and `as_uid` leaves root inside it; as anyone
        else, a user namespace maps the caller to the agent's uid."""
        if self.workspace.uid is not None:
            return []
        uid = str(INSIDE_UID)
        return ["--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid]

    def _workspace_binds(self, sockets: Path | None) -> list[str]:
        space = self.workspace
        binds = []
        for inside, host in space.writable_binds().items():
            binds += ["--bind", str(host), inside]
        for name in ("passwd", "group", "hosts"):
            binds += ["--ro-bind", str(space.etc / name), f"/etc/{name}"]
        if sockets is not None:
            binds += ["--ro-bind", str(sockets), "/run/reef"]
        for inside, host in self.mounts.items():
            binds += ["--ro-bind", str(host), inside]
        return binds

    def _readonly_paths(self) -> dict[Path, str]:
        """Host path -> path inside: the Python running Reef and this package (for the relay
        and the native agent), and what was asked."""
        same = [Path(sys.prefix), Path(sys.base_prefix), *self.readonly]
        paths = {path: str(path) for path in same if path.exists()}
        return {**paths, EPISODES_PACKAGE: INSIDE_PACKAGE}


def python_path() -> str:
    """This Python's path, as the sandbox sees it (its prefixes are bound at the same path)."""
    return sys.executable


def base_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/home/agent",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": "agent",
    }


def _parent_folders(paths: list[str]) -> list[str]:
    """The folders above `paths`, made readable: bubblewrap would make them 0700, root's."""
    parents = {
        str(parent) for path in paths for parent in Path(path).parents if parent != Path("/")
    }
    args = []
    for parent in sorted(parents, key=lambda name: name.count("/")):
        args += ["--perms", "0755", "--dir", parent]
    return args


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        host = Path("/") / top
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{top}"]
    for name in HOST_ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args
