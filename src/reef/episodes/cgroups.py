"""Limits the kernel keeps: each episode's processes in a cgroup of their own.

Polling a process tree misses what no process holds as resident memory (a memfd, a file on a
tmpfs, shared memory) and races a fast fork. A cgroup's `memory` limit counts all of those, its
`pids` limit refuses the fork itself, and its `cpu` quota caps the share of the machine; its
event counters say afterwards which limit was met.

Where: cgroup v2, under Reef's own cgroup, when its memory and pids controllers can be
delegated there; else cgroup v1's memory and pids hierarchies (a hybrid host, as root); else
none, and `support()` says why, so that the episodes' limits are known to hold only by polling.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED = ("memory", "pids")
CPU_PERIOD_US = 100_000
SERVER_LEAF = "reef-server"  # v2: where Reef moves itself so its cgroup may delegate


@dataclass(frozen=True)
class Support:
    """Whether episodes get cgroups here: the version, and under which folders (controller ->
    folder; one folder for all of v2's)."""

    version: int | None
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.version is not None


@functools.cache
def support() -> Support:
    """cgroup v2 if it can be delegated here, else v1 if it is writable, else why neither."""
    v2 = _v2_support()
    if isinstance(v2, Support):
        return v2
    v1 = _v1_support()
    if isinstance(v1, Support):
        return v1
    return Support(None, reason=f"{v2}; {v1}")


class EpisodeCgroup:
    """One run's cgroup, made with its limits; `close()` kills what is left and removes it."""

    def __init__(
        self,
        found: Support,
        memory_mb: int | None,
        processes: int | None,
        cpus: float | None,
    ) -> None:
        name = f"reef-episode-{secrets.token_hex(6)}"
        self.version = found.version
        self.folders = {controller: parent / name for controller, parent in found.parents.items()}
        try:
            for folder in set(self.folders.values()):
                folder.mkdir()
            self._limit(memory_mb, processes, cpus)
        except OSError:
            self.close()  # the hierarchies made so far go too
            raise

    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to enter (every hierarchy's, in v1)."""
        return sorted({str(folder / "cgroup.procs") for folder in self.folders.values()})

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for passing its memory limit."""
        if self.version == 2:
            return _counter(self.folders["memory"] / "memory.events", "oom_kill") > 0
        return _counter(self.folders["memory"] / "memory.oom_control", "oom_kill") > 0

    def processes_refused(self) -> bool:
        """Whether a fork was refused for passing the process limit."""
        return _counter(self.folders["pids"] / "pids.events", "max") > 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files():
            with contextlib.suppress(OSError):
                found |= {int(line) for line in Path(procs).read_text().split()}
        return found

    def kill(self) -> None:
        """Every process in the cgroup, killed; returns once none is left (or after 5 s)."""
        kill_file = self.folders["memory"] / "cgroup.kill"
        deadline = time.monotonic() + 5
        while (pids := self.pids()) and time.monotonic() < deadline:
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def close(self) -> None:
        self.kill()
        for folder in set(self.folders.values()):
            with contextlib.suppress(OSError):
                folder.rmdir()

    def _limit(self, memory_mb: int | None, processes: int | None, cpus: float | None) -> None:
        memory, pids = self.folders["memory"], self.folders["pids"]
        if self.version == 2:
            if memory_mb is not None:
                _write(memory / "memory.max", memory_mb << 20)
                _write_if_there(memory / "memory.swap.max", 0)
            _write(memory / "memory.oom.group", 1)  # a memory kill takes the whole run
        elif memory_mb is not None:
            _write(memory / "memory.limit_in_bytes", memory_mb << 20)
            _write_if_there(memory / "memory.memsw.limit_in_bytes", memory_mb << 20)
        if processes is not None:
            _write(pids / "pids.max", processes)
        cpu = self.folders.get("cpu")
        if cpus is None or cpu is None:
            return
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if self.version == 2:
            _write(cpu / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(cpu / "cpu.cfs_quota_us", quota)


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")


def _write_if_there(path: Path, value: object) -> None:
    if path.exists():
        _write(path, value)


def _counter(path: Path, key: str) -> int:
    """A `key value` line of a cgroup's flat-keyed file (memory.events, pids.events…)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


# Finding the hierarchies: /proc/self/cgroup says where this process is in each, and
# /proc/self/mountinfo where each is mounted.


@dataclass(frozen=True)
class _Mount:
    fstype: str
    point: Path
    root: str
    options: frozenset[str]


def _mounts() -> list[_Mount]:
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            options = frozenset(tail[2].split(","))
            mounts.append(_Mount(tail[0], Path(fields[4]), fields[3], options))
    return mounts


def _own_paths() -> dict[str, str]:
    """This process's cgroup in each hierarchy: controller -> path ('' for v2's)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _folder(mount: _Mount, path: str) -> Path | None:
    """Where cgroup `path` of the mount's hierarchy lies, if the mount shows it."""
    relative = os.path.relpath(path, mount.root)
    if relative.startswith(".."):
        return None
    return (mount.point / relative).resolve()


def _v2_support() -> Support | str:
    own = _own_paths().get("")
    mount = next((m for m in _mounts() if m.fstype == "cgroup2"), None)
    if own is None or mount is None:
        return "no cgroup v2 hierarchy"
    folder = _folder(mount, own)
    if folder is None:
        return "Reef's cgroup v2 is not visible in its mount"
    try:
        offered = set((folder / "cgroup.controllers").read_text().split())
    except OSError as error:
        return f"cgroup v2 at {folder} cannot be read ({error.strerror})"
    missing = [name for name in REQUIRED if name not in offered]
    if missing:
        return f"cgroup v2 offers no {' or '.join(missing)} controller to Reef's cgroup {folder}"
    wanted = [*REQUIRED, *(["cpu"] if "cpu" in offered else [])]
    problem = _delegate(folder, wanted)
    if problem:
        return problem
    return Support(2, {name: folder for name in wanted}, reason=f"cgroup v2 under {folder}")


def _delegate(folder: Path, controllers: list[str]) -> str | None:
    """Enable `controllers` for `folder`'s children. A cgroup with processes of its own cannot
    (cgroup v2's rule that only leaves hold processes): Reef then moves itself into a leaf."""
    control = folder / "cgroup.subtree_control"
    request = " ".join(f"+{name}" for name in controllers)
    try:
        _write(control, request)
        return None
    except OSError as error:
        if error.errno != errno.EBUSY:
            return f"cannot delegate cgroup v2 controllers at {folder} ({error.strerror})"
    try:
        leaf = folder / SERVER_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in (folder / "cgroup.procs").read_text().split():
            _write(leaf / "cgroup.procs", pid)
        _write(control, request)
        return None
    except OSError as error:
        return f"cannot delegate cgroup v2 controllers at {folder} ({error.strerror})"


def _v1_support() -> Support | str:
    own = _own_paths()
    parents: dict[str, Path] = {}
    for controller in [*REQUIRED, "cpu"]:
        mount = next(
            (m for m in _mounts() if m.fstype == "cgroup" and controller in m.options), None
        )
        folder = None if mount is None or controller not in own else _folder(mount, own[controller])
        if folder is None or not _can_make_child(folder):
            if controller in REQUIRED:
                return f"cgroup v1's {controller} hierarchy is not writable here"
            continue
        parents[controller] = folder
    return Support(1, parents, reason="cgroup v1 (" + ", ".join(sorted(parents)) + ")")


def _can_make_child(folder: Path) -> bool:
    probe = folder / f"reef-probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False
