"""One episode's sandbox: bubblewrap over the host's tools, with one writable folder.

The episode's folder on the host (a `Workspace`) is mapped as Harbor maps a task's container:
`/app` (the work folder, the task's `environment/` files copied in), `/logs` (writable),
`/tests` (read-only, for the verifier only), plus `/home/agent` and `/tmp`, all inside that
folder. The host's `/usr` and a few files of `/etc` are read-only; the network namespace is
empty but for Reef's port, relayed (relay.py). As root, the sandbox runs as a uid of its own,
so process limits count its processes alone.

Limits (`Limits`): wall time, CPU time, memory, processes and disk written stop the run and are
named in `SandboxResult.limit`; output past its cap is dropped and flagged.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Literal

from reef.episodes.relay import OutsideRelay

SandboxMode = Literal["bwrap", "none"]
POLL_S = 0.1
DISK_POLL_S = 0.5
INSIDE_UID = 1000
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


@dataclass(frozen=True)
class Limits:
    """What one run may use; None lifts a limit (wall time always applies)."""

    wall_time_s: float = 600.0
    cpu_time_s: float | None = 600.0
    memory_mb: int | None = 4096
    processes: int | None = 256
    disk_mb: int | None = 2048
    output_bytes: int = 1_000_000

    def within(self, wall_time_s: float | None) -> Limits:
        """These limits with a task's own wall time when it is shorter."""
        if wall_time_s is None or wall_time_s >= self.wall_time_s:
            return self
        return replace(self, wall_time_s=wall_time_s)


@dataclass
class SandboxResult:
    exit_code: int | None  # None when a limit killed it
    output: str
    output_truncated: bool
    limit: str | None  # wall_time, cpu_time, memory, processes, disk: the one that stopped it
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


@dataclass(frozen=True)
class Workspace:
    """The episode's folder on the host, the only place its sandbox writes."""

    root: Path
    uid: int | None = None  # the uid the sandbox runs as (root only)

    @property
    def app(self) -> Path:
        return self.root / "app"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def etc(self) -> Path:
        return self.root / "etc"  # the sandbox's passwd and group, read-only inside

    def writable(self) -> list[Path]:
        return [self.app, self.logs, self.home, self.tmp]


def create_workspace(root: Path, environment: Path | None = None) -> Workspace:
    """A fresh workspace at `root`, /app holding `environment`'s files but its Dockerfile."""
    uid = random.randrange(200_000, 260_000) if os.geteuid() == 0 else None
    workspace = Workspace(root=root, uid=uid)
    for folder in [*workspace.writable(), workspace.etc]:
        folder.mkdir(parents=True, exist_ok=True)
    for sub in ("agent", "verifier"):
        (workspace.logs / sub).mkdir(exist_ok=True)
    if environment is not None and environment.is_dir():
        ignore = shutil.ignore_patterns("Dockerfile", ".dockerignore")
        shutil.copytree(environment, workspace.app, dirs_exist_ok=True, ignore=ignore)
    agent = inside_uid(workspace)
    (workspace.etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\nagent:x:{agent}:{agent}::/home/agent:/bin/bash\n"
    )
    (workspace.etc / "group").write_text(f"root:x:0:\nagent:x:{agent}:\n")
    (workspace.etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    give_to_sandbox(workspace)
    return workspace


def give_to_sandbox(workspace: Workspace) -> None:
    """The writable folders owned by the sandbox's uid."""
    if workspace.uid is None:
        return
    for folder in workspace.writable():
        for path in [folder, *folder.rglob("*")]:
            os.lchown(path, workspace.uid, workspace.uid)


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run a sandbox here, or None when it can."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run(
        [binary, *_system_binds(), "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
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
        if self.reef_port is None:
            return supervise(self._bwrap(command, None), full_env, self.workspace, self.limits)
        # A socket's path is at most 107 bytes: its folder is a short one of its own.
        with tempfile.TemporaryDirectory(prefix="reef-", dir="/tmp") as folder:
            sockets = Path(folder)
            if self.workspace.uid is not None:
                os.chown(sockets, self.workspace.uid, self.workspace.uid)
            with OutsideRelay(sockets / "reef.sock", self.reef_port, owner=self.workspace.uid):
                args = self._bwrap(command, sockets)
                return supervise(args, full_env, self.workspace, self.limits)

    def _bwrap(self, command: list[str], sockets: Path | None) -> list[str]:
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
        # also try a user namespace, in which the uid `drop_to` takes does not exist.
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        args += ["--hostname", "episode"]
        args += [*self._identity(), "--chdir", "/app", "--"]
        if self.workspace.uid is not None:
            args += drop_to(self.workspace.uid)
        if self.reef_port is not None:
            args += [python_path(), f"{INSIDE_PACKAGE}/relay.py", SOCKET_INSIDE]
            args += [str(self.reef_port), "--"]
        return args + command

    def _identity(self) -> list[str]:
        """As root, bubblewrap sets up the sandbox and `drop_to` leaves root inside it; as anyone
        else, a user namespace maps the caller to the agent's uid."""
        if self.workspace.uid is not None:
            return []
        uid = str(INSIDE_UID)
        return ["--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid]

    def _workspace_binds(self, sockets: Path | None) -> list[str]:
        space = self.workspace
        binds = ["--bind", str(space.app), "/app", "--bind", str(space.logs), "/logs"]
        binds += ["--bind", str(space.home), "/home/agent", "--bind", str(space.tmp), "/tmp"]
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


def drop_to(uid: int) -> list[str]:
    """The command prefix that runs the rest as `uid`, without capabilities, and unable to
    gain any (setuid binaries of the host's /usr do nothing)."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def inside_uid(workspace: Workspace) -> int:
    return INSIDE_UID if workspace.uid is None else workspace.uid


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


# Supervision: the run, its output, its limits.


def supervise(
    command: list[str],
    env: dict[str, str],
    workspace: Workspace,
    limits: Limits,
    cwd: Path | None = None,
) -> SandboxResult:
    """Run `command` to its end or to the first limit it hits, whichever comes first."""
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_child_setup(limits),
    )
    assert process.stdout is not None
    output = OutputCap(limits.output_bytes)
    reader = threading.Thread(target=output.read_all, args=(process.stdout,), daemon=True)
    reader.start()
    limit = _watch(process, workspace, limits, started)
    if limit is not None:
        _kill_tree(process)
    process.wait()
    reader.join(5)
    code = process.returncode
    limit = limit or _limit_of_signal(code)
    return SandboxResult(
        exit_code=None if limit else code,
        output=output.text(),
        output_truncated=output.truncated,
        limit=limit,
        seconds=time.monotonic() - started,
    )


def _child_setup(limits: Limits) -> Callable[[], None]:
    """The kernel's limits, set in the child before it runs (and inherited by all it starts;
    the process limit counts the processes of the sandbox's own uid)."""

    def setup() -> None:
        if limits.cpu_time_s is not None:
            seconds = int(limits.cpu_time_s) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
        if limits.disk_mb is not None:
            size = limits.disk_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        if limits.processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return setup


def _watch(
    process: subprocess.Popen[bytes], workspace: Workspace, limits: Limits, started: float
) -> str | None:
    """Poll until the process ends; the name of the limit it passed first, if it did."""
    next_disk = 0.0
    while process.poll() is None:
        now = time.monotonic()
        if now - started > limits.wall_time_s:
            return "wall_time"
        usage = tree_usage(process.pid)
        if limits.memory_mb is not None and usage.rss_mb > limits.memory_mb:
            return "memory"
        if limits.cpu_time_s is not None and usage.cpu_s > limits.cpu_time_s:
            return "cpu_time"
        if limits.processes is not None and usage.processes >= limits.processes:
            return "processes"
        if limits.disk_mb is not None and now >= next_disk:
            next_disk = now + DISK_POLL_S
            if folder_mb(workspace.writable()) > limits.disk_mb:
                return "disk"
        time.sleep(POLL_S)
    return None


def _limit_of_signal(code: int | None) -> str | None:
    """A run the kernel stopped at an rlimit: SIGXCPU (CPU time) or SIGXFSZ (a file's size)."""
    if code is None:
        return None
    signals = {signal.SIGXCPU: "cpu_time", signal.SIGXFSZ: "disk"}
    for number, name in signals.items():
        if code in (-number, 128 + number):
            return name
    return None


class OutputCap:
    """The first `cap` bytes of a stream; the rest read and dropped, and flagged."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.truncated = False

    def read_all(self, stream: IO[bytes]) -> None:
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            room = self.cap - len(self.kept)
            if len(chunk) > room:
                self.truncated = True
            self.kept += chunk[: max(room, 0)]

    def text(self) -> str:
        return self.kept.decode(errors="replace")


@dataclass(frozen=True)
class TreeUsage:
    processes: int
    rss_mb: float
    cpu_s: float


def descendants(root: int) -> list[int]:
    """`root` and every process below it (a sandbox's processes stay in its tree: orphans are
    adopted by bubblewrap's init inside its PID namespace)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def tree_usage(root: int) -> TreeUsage:
    """Processes, resident memory and CPU time (theirs and their waited-for children's)."""
    ticks = os.sysconf("SC_CLK_TCK")
    page_mb = os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    count, rss, cpu = 0, 0.0, 0.0
    for pid in descendants(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        count += 1
        cpu += sum(int(value) for value in fields[11:15]) / ticks  # utime stime cutime cstime
        rss += int(fields[21]) * page_mb
    return TreeUsage(processes=count, rss_mb=rss, cpu_s=cpu)


def folder_mb(folders: list[Path]) -> float:
    """Disk used under `folders`, in MiB (blocks allocated, so sparse files count as written)."""
    total = 0
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in [*filenames, *dirnames]:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    continue
    return total / (1024 * 1024)


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    for pid in reversed(descendants(process.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
