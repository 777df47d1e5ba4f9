"""The sandbox on its own: one port reachable, one folder writable, each limit named."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.episodes.sandbox import Limits, Sandbox, SandboxResult, create_workspace

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
    tmp_path: Path, script: str, limits: Limits | None = None, **options: object
) -> SandboxResult:
    sandbox = Sandbox(
        create_workspace(tmp_path / "ws"), limits or Limits(wall_time_s=30), **options
    )  # type: ignore[arg-type]
    return sandbox.run(["bash", "-c", script], {})


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
    tmp_path: Path, limit: str, limits: Limits, script: str
) -> None:
    result = run(tmp_path, script, limits)
    assert result.limit == limit, result.output
    assert result.exit_code is None
    assert result.seconds < 20


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
