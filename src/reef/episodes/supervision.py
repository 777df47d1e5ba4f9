"""Supervision of one run: its limits, its output, and the name of the limit that stopped it.

The kernel keeps what it can: the run's processes enter a cgroup of their own (cgroups.py:
memory, including memfds and tmpfs pages; processes; CPU share), a capped workspace is a tmpfs
of the disk limit's size (workspace.py), and rlimits bound each process's CPU time and file
size. A poll every `POLL_S` watches the wall time, reads the cgroup's event counters to name the
limit met, and, where no cgroup or cap is had, measures the tree itself: resident memory plus
the memfds it holds, its folders' size plus the deleted files it still holds open.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from reef.episodes import cgroups
from reef.episodes.workspace import Workspace, at_disk_limit

POLL_S = 0.1
DISK_POLL_S = 0.5
MIB = 1024 * 1024

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one run may use; None lifts a limit (wall time always applies)."""

    wall_time_s: float = 600.0
    cpu_time_s: float | None = 600.0
    memory_mb: int | None = 4096
    processes: int | None = 256
    disk_mb: int | None = 2048
    output_bytes: int = 1_000_000
    cpus: float | None = None  # the share of the machine's CPUs (a cgroup's quota)

    def within(
        self, wall_time_s: float | None, memory_mb: int | None = None, cpus: float | None = None
    ) -> Limits:
        """These limits with a task's own wall time and memory when they are tighter, and its
        CPUs."""
        changed = self
        if wall_time_s is not None and wall_time_s < self.wall_time_s:
            changed = replace(changed, wall_time_s=wall_time_s)
        if memory_mb is not None and (self.memory_mb is None or memory_mb < self.memory_mb):
            changed = replace(changed, memory_mb=memory_mb)
        if cpus is not None:
            changed = replace(changed, cpus=cpus)
        return changed


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


def enforcement(limits: Limits) -> str | None:
    """A sentence naming the limits that hold only by polling on this machine, or None when
    the kernel keeps them all."""
    found = cgroups.support()
    named = {"memory": limits.memory_mb, "processes": limits.processes}
    polled = [] if found.available else [name for name, cap in named.items() if cap is not None]
    why = [] if found.available else [f"no cgroup for episodes here: {found.reason}"]
    if limits.disk_mb is not None and os.geteuid() != 0:
        polled.append("disk")
        why.append("a size-capped tmpfs per workspace needs root")
    if not polled:
        return None
    return (
        f"the episodes' {', '.join(polled)} limits hold only by polling ({'; '.join(why)}): "
        "a run's resident memory and memfds, its folders and open deleted files, "
        f"measured every {POLL_S:g} s"
    )


def supervise(
    command: list[str],
    env: dict[str, str],
    workspace: Workspace,
    limits: Limits,
    cwd: Path | None = None,
    keep_fds: tuple[int, ...] = (),
) -> SandboxResult:
    """Run `command` to its end or to the first limit it hits, whichever comes first;
    `keep_fds` stay open in it (bubblewrap's seccomp filter)."""
    cgroup = _cgroup(limits)
    try:
        return _supervise(command, env, workspace, limits, cwd, cgroup, keep_fds)
    finally:
        if cgroup is not None:
            cgroup.close()


def _supervise(
    command: list[str],
    env: dict[str, str],
    workspace: Workspace,
    limits: Limits,
    cwd: Path | None,
    cgroup: cgroups.EpisodeCgroup | None,
    keep_fds: tuple[int, ...] = (),
) -> SandboxResult:
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        pass_fds=keep_fds,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_child_setup(limits, cgroup),
    )
    assert process.stdout is not None
    output = OutputCap(limits.output_bytes)
    reader = threading.Thread(target=output.read_all, args=(process.stdout,), daemon=True)
    reader.start()
    limit = _watch(process, workspace, limits, started, cgroup)
    if limit is not None:
        _kill_tree(process)
    process.wait()
    if cgroup is not None:
        cgroup.kill()  # what left the tree (a daemon of a run without bubblewrap) goes too
        limit = limit or _cgroup_limit(cgroup)
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


class LimitNotEnforced(RuntimeError):
    """A machine with cgroups could not make this run's: its limits would not hold."""


def _cgroup(limits: Limits) -> cgroups.EpisodeCgroup | None:
    """The run's cgroup; None on a machine without cgroups (its limits by polling, said at
    start). Where cgroups exist but this one cannot be made with its limits, the run is
    refused: it would otherwise run without them (issue 74: a cgroup write that failed let
    the episode run with no memory limit)."""
    found = cgroups.support()
    if not found.available:
        return None
    try:
        return cgroups.EpisodeCgroup(found, limits.memory_mb, limits.processes, limits.cpus)
    except OSError as error:  # EpisodeCgroup removed what it had made
        raise LimitNotEnforced(
            f"its limits cannot be enforced: the cgroup for memory {limits.memory_mb} MB, "
            f"{limits.processes} processes and {limits.cpus} CPUs was refused ({error})"
        ) from None


def _child_setup(limits: Limits, cgroup: cgroups.EpisodeCgroup | None) -> Callable[[], None]:
    """The kernel's limits, set in the child before it runs (and inherited by all it starts;
    the process limit counts the processes of the sandbox's own uid)."""
    procs_files = cgroup.procs_files() if cgroup is not None else []

    def setup() -> None:
        for procs in procs_files:
            with open(procs, "w") as entry:
                entry.write(str(os.getpid()))
        if limits.cpu_time_s is not None:
            seconds = int(limits.cpu_time_s) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
        if limits.disk_mb is not None:
            size = limits.disk_mb * MIB
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        if limits.processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return setup


def _watch(
    process: subprocess.Popen[bytes],
    workspace: Workspace,
    limits: Limits,
    started: float,
    cgroup: cgroups.EpisodeCgroup | None,
) -> str | None:
    """Poll until the process ends; the name of the limit it passed first, if it did."""
    next_disk = 0.0
    # What the kernel does not count here: memfds (no cgroup), open deleted files (no tmpfs).
    held_files = cgroup is None or not workspace.capped
    while process.poll() is None:
        now = time.monotonic()
        if now - started > limits.wall_time_s:
            return "wall_time"
        if cgroup is not None and (limit := _cgroup_limit(cgroup)):
            return limit
        usage = tree_usage(process.pid, held_files)
        if limits.memory_mb is not None and usage.memory_mb > limits.memory_mb:
            return "memory"
        if limits.cpu_time_s is not None and usage.cpu_s > limits.cpu_time_s:
            return "cpu_time"
        if limits.processes is not None and usage.processes >= limits.processes:
            return "processes"
        if workspace.capped and at_disk_limit(workspace):
            return "disk"  # a statvfs: cheap enough for every poll
        if limits.disk_mb is not None and not workspace.capped and now >= next_disk:
            next_disk = now + DISK_POLL_S
            if folder_mb(workspace.writable()) + usage.deleted_mb > limits.disk_mb:
                return "disk"
        time.sleep(POLL_S)
    return None


def _cgroup_limit(cgroup: cgroups.EpisodeCgroup) -> str | None:
    if cgroup.memory_killed():
        return "memory"
    if cgroup.processes_refused():
        return "processes"
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
    memory_mb: float  # resident memory, and the memfds the tree holds
    cpu_s: float
    deleted_mb: float = 0.0  # files deleted while the tree holds them open


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


def tree_usage(root: int, held_files: bool = True) -> TreeUsage:
    """Processes, memory and CPU time (theirs and their waited-for children's); with
    `held_files`, the memfds (as memory) and the deleted files they hold open, which takes a
    look at every descriptor of the tree."""
    ticks = os.sysconf("SC_CLK_TCK")
    page_mb = os.sysconf("SC_PAGE_SIZE") / MIB
    count, rss, cpu = 0, 0.0, 0.0
    pids = descendants(root)
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        count += 1
        cpu += sum(int(value) for value in fields[11:15]) / ticks  # utime stime cutime cstime
        rss += int(fields[21]) * page_mb
    memfds, deleted = held_files_mb(pids) if held_files else (0.0, 0.0)
    return TreeUsage(processes=count, memory_mb=rss + memfds, cpu_s=cpu, deleted_mb=deleted)


def held_files_mb(pids: list[int]) -> tuple[float, float]:
    """MiB held through open descriptors that no folder shows: memfds, and deleted files."""
    seen: set[tuple[int, int]] = set()
    memfds = deleted = 0
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            path = f"/proc/{pid}/fd/{descriptor}"
            try:
                target = os.readlink(path)
                if not (target.startswith("/memfd:") or target.endswith(" (deleted)")):
                    continue
                info = os.stat(path)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            if target.startswith("/memfd:"):
                memfds += info.st_blocks * 512
            else:
                deleted += info.st_blocks * 512
    return memfds / MIB, deleted / MIB


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
    return total / MIB


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    for pid in reversed(descendants(process.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
