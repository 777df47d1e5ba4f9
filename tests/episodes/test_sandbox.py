"""The sandbox on its own: one port reachable, one folder writable, each limit named, and the
limits an agent walked around before (memory held in memfds, disk in open deleted files) kept
by the kernel where it can, and by polling where it cannot."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.episodes import cgroups
from reef.episodes.sandbox import Limits, Sandbox, SandboxResult
from reef.episodes.supervision import LimitNotEnforced
from reef.episodes.workspace import create_workspace, release_workspace

# 400 MiB in memfds, which no process maps: a tree's resident memory does not show them.
MEMFDS = (
    "python3 -c 'import os, time\n"
    "fds = [os.memfd_create(str(i)) for i in range(4)]\n"
    "[os.write(fd, bytes(100 << 20)) for fd in fds]\n"
    'print("held", flush=True); time.sleep(30)\''
)
# 40 MiB in four 10 MiB files deleted while held open: no folder shows them, and each is
# under the 16 MiB that one file may be. A write the kernel refuses is not the end: the run
# keeps what it got, as an agent would.
DELETED = (
    "python3 -c 'import os, time\n"
    "held = []\n"
    "try:\n"
    "    for i in range(4):\n"
    '        f = open(f"/app/f{i}", "wb"); os.unlink(f"/app/f{i}"); held.append(f)\n'
    "        f.write(bytes(10 << 20)); f.flush()\n"
    "except OSError as error: print(error, flush=True)\n"
    "time.sleep(30)'"
)

PROBE = """
import socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "open"
    except OSError as error:
        return type(error).__name__
print("reef", reach("127.0.0.1", {reef}))
print("other", reach("127.0.0.1", {other}))
print("external", reach("1.1.1.1", 80))
"""


@pytest.fixture
def listening() -> Iterator[list[int]]:
    """Two loopback ports on the host: the first plays Reef, the second must stay unreachable."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]

    def accept(server: socket.socket) -> None:
        while True:
            try:
                server.accept()[0].close()
            except OSError:
                return

    for server in servers:
        threading.Thread(target=accept, args=(server,), daemon=True).start()
    yield [server.getsockname()[1] for server in servers]
    for server in servers:
        server.close()


def run(
    tmp_path: Path,
    script: str,
    limits: Limits | None = None,
    capped: bool = False,
    **options: object,
) -> SandboxResult:
    limits = limits or Limits(wall_time_s=30)
    workspace = create_workspace(tmp_path / "ws", disk_mb=limits.disk_mb if capped else None)
    try:
        return Sandbox(workspace, limits, **options).run(["bash", "-c", script], {})  # type: ignore[arg-type]
    finally:
        release_workspace(workspace, keep=True)


@pytest.fixture(params=["kernel", "polling"])
def keeper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each limit test twice: with this machine's cgroups, and as on a machine without any."""
    if request.param == "kernel" and not cgroups.support().available:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root with cgroups: {cgroups.support().reason}")
        pytest.skip(cgroups.support().reason)
    if request.param == "polling":
        monkeypatch.setattr(cgroups, "support", lambda: cgroups.Support(None, reason="test"))
    return str(request.param)


def test_only_reefs_port_is_reachable(tmp_path: Path, listening: list[int]) -> None:
    reef, other = listening
    probe = PROBE.format(reef=reef, other=other)
    result = run(tmp_path, f"python3 -c '{probe}'", reef_port=reef)
    assert result.ok, result.output
    assert "reef open" in result.output
    assert "other ConnectionRefusedError" in result.output
    assert "external open" not in result.output and "external " in result.output


def test_writes_only_inside_its_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    script = (
        "echo ok > /app/a && echo ok > /logs/b && echo ok > /tmp/c && echo ok > /home/agent/d; "
        f"for target in /usr/x /etc/x /x {outside} /root/x; do "
        'echo bad > "$target" 2>/dev/null && echo "WROTE $target"; done; '
        f"ls {tmp_path} 2>&1 | head -1"
    )
    result = run(tmp_path, script)
    assert result.ok, result.output
    assert "WROTE" not in result.output
    assert "No such file" in result.output  # the host's folders are not even visible
    assert not outside.exists()
    assert (tmp_path / "ws" / "app" / "a").read_text() == "ok\n"


@pytest.mark.parametrize(
    ("limit", "limits", "script"),
    [
        ("wall_time", Limits(wall_time_s=1), "sleep 30"),
        ("cpu_time", Limits(wall_time_s=30, cpu_time_s=1), "while :; do :; done"),
        (
            "memory",
            Limits(wall_time_s=30, memory_mb=100),
            "python3 -c 'import time; b = bytearray(400 << 20); time.sleep(30)'",
        ),
        (
            "processes",
            Limits(wall_time_s=30, processes=20),
            "for i in $(seq 50); do sleep 30 & done; wait",
        ),
        (
            "disk",
            Limits(wall_time_s=30, disk_mb=10),
            "head -c 50000000 /dev/zero > /app/big; sleep 30",
        ),
    ],
)
def test_each_limit_stops_the_run_and_is_named(
    tmp_path: Path, limit: str, limits: Limits, script: str, keeper: str
) -> None:
    result = run(tmp_path, script, limits)
    assert result.limit == limit, result.output
    assert result.exit_code is None
    assert result.seconds < 20


def test_memory_held_in_memfds_is_a_memory_limit(tmp_path: Path, keeper: str) -> None:
    result = run(tmp_path, MEMFDS, Limits(wall_time_s=30, memory_mb=100))
    assert result.limit == "memory", result.output
    assert result.seconds < 20


@pytest.mark.parametrize("capped", [True, False], ids=["tmpfs", "folder"])
def test_disk_held_in_open_deleted_files_is_a_disk_limit(
    tmp_path: Path, capped: bool, keeper: str
) -> None:
    if capped and os.geteuid() != 0:
        pytest.skip("a capped workspace is a tmpfs, mounted as root only")
    result = run(tmp_path, DELETED, Limits(wall_time_s=30, disk_mb=16), capped=capped)
    assert result.limit == "disk", result.output
    assert result.seconds < 20


def test_a_run_leaves_no_cgroup_and_no_mount_behind(
    tmp_path: Path, keeper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's own cgroups, not the machine's: other workers' episodes come and go meanwhile."""
    made = _made_cgroups(monkeypatch)
    root = tmp_path / "ws"
    result = run(tmp_path, "sleep 30 & sleep 30 & wait", Limits(wall_time_s=1), capped=True)
    assert result.limit == "wall_time"
    assert len(made) == (1 if keeper == "kernel" else 0)  # polling: a machine without cgroups
    folders = [folder for cgroup in made for folder in cgroup.folders.values()]
    assert [folder for folder in folders if folder.exists()] == []
    assert not os.path.ismount(root) and root.is_dir()


def _made_cgroups(monkeypatch: pytest.MonkeyPatch) -> list[cgroups.EpisodeCgroup]:
    """Every cgroup a run makes from now on, recorded as it is made."""
    made: list[cgroups.EpisodeCgroup] = []

    class Recorded(cgroups.EpisodeCgroup):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(cgroups, "EpisodeCgroup", Recorded)
    return made


def test_output_past_its_cap_is_dropped_and_flagged(tmp_path: Path) -> None:
    result = run(tmp_path, "head -c 1000000 /dev/zero | tr '\\0' x", Limits(output_bytes=10_000))
    assert result.ok
    assert result.output_truncated
    assert len(result.output) == 10_000


def test_a_python_under_tmp_is_reachable_inside(tmp_path: Path) -> None:
    """Reef in a virtual environment under /tmp (a CI checkout there): the paths bound read-only
    for it lie under the episode's own /tmp, and the agent can still run what they hold."""
    tool = tmp_path / "venv" / "bin" / "tool"  # tmp_path is under /tmp
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    assert str(tool).startswith("/tmp/")
    result = run(tmp_path, str(tool), readonly=[tmp_path / "venv"])
    assert result.ok, result.output
    assert "tool ran" in result.output


def test_a_limit_the_cgroup_refuses_refuses_the_run_and_leaves_no_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 74: a cgroup write that failed let the run go on with a warning and no memory
    limit. The kernel's refusal of a limit cannot be made to happen here on purpose (this
    machine's cgroup accepts every value a task may now ask for), so the write that fails is
    stubbed: the last one, after the cgroup's folders were made."""
    if not cgroups.support().available:
        pytest.skip("this machine has no cgroups to make")
    folders: list[Path] = []

    def refused(self: cgroups.EpisodeCgroup, *args: Any) -> None:
        folders.extend(self.folders.values())
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(cgroups.EpisodeCgroup, "_limit", refused)
    with pytest.raises(LimitNotEnforced, match="its limits cannot be enforced"):
        run(tmp_path, "echo ran > /app/ran", Limits(wall_time_s=10, memory_mb=128))
    assert folders and not [folder for folder in folders if folder.exists()]
    assert not (tmp_path / "ws" / "app" / "ran").exists()  # the command never ran
