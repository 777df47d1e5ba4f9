"""Start real server processes on free loopback ports, wait for them, stop or kill them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A child process serving HTTP on 127.0.0.1:`port`, ready once `health_path` answers 200."""

    def __init__(
        self,
        args: list[str],
        port: int,
        cwd: Path,
        env: dict[str, str] | None = None,
        health_path: str = "/healthz",
        log_name: str = "server.log",
    ) -> None:
        self.args = args
        self.port = port
        self.cwd = Path(cwd)
        self.env = {**os.environ, **(env or {})}
        self.health_path = health_path
        self.log_path = self.cwd / log_name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        if self.process is not None:
            raise RuntimeError(f"{self.args[0]} on port {self.port} was already started")
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.args, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT (Ctrl-C) and wait; returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ServerProcess:
        if self.process is None:  # `with server.start():` has started it already
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_reef(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`reef ARGS…` run to the end in `cwd` as its own process; `env` replaces the environment."""
    return subprocess.run(
        [sys.executable, "-m", "reef", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def reef_serve(
    cwd: Path, port: int, *extra: str, env: dict[str, str] | None = None
) -> ServerProcess:
    """`reef serve` in `cwd` on `port` (not started yet)."""
    args = [sys.executable, "-m", "reef", "serve", "--port", str(port), *extra]
    return ServerProcess(args, port, cwd, env=env, log_name=f"reef-{port}.log")


def serving_everywhere(
    servers: list[ServerProcess],
    release_id: str,
    token: str,
    scenario: str = "default",
    timeout: float = 60.0,
) -> bool:
    """Poll each server's `/reef/status` until all of them serve `release_id` for `scenario`;
    whether they did within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    headers = {"authorization": f"Bearer {token}"}
    waiting = list(servers)
    while waiting and time.monotonic() < deadline:
        waiting = [
            server
            for server in waiting
            if httpx.get(f"{server.url}/reef/status", headers=headers)
            .json()["serving"]
            .get(scenario)
            != release_id
        ]
        if waiting:
            time.sleep(0.02)
    return not waiting
