"""How other processes find the running server: `.reef/server.json`, readable by its owner only.

`reef serve` writes the file once it listens (its URL, its process id and a fresh internal token)
and removes it when it stops. A command that needs the model while the server runs reads it and
asks that server instead of loading a second copy of the model. Whoever can read the state folder
can read every record already, so the token in it grants nothing new.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

SERVER_FILE = "server.json"


@dataclass(frozen=True)
class RunningServer:
    url: str
    token: str
    pid: int


def new_internal_token() -> str:
    return secrets.token_urlsafe(32)


def loopback_url(host: str, port: int) -> str:
    """The URL this machine's processes use to reach a server bound to `host`."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def advertise(state_dir: Path, server: RunningServer) -> Path:
    """Write the server file atomically, created with mode 0600 (never readable by others)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / SERVER_FILE
    staging = state_dir / f".{SERVER_FILE}.{os.getpid()}"
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(asdict(server), file)
    os.replace(staging, path)
    return path


def withdraw(state_dir: Path, server: RunningServer) -> None:
    """Remove the server file if it is still this server's."""
    if find_advertised(state_dir) == server:
        with contextlib.suppress(FileNotFoundError):
            (state_dir / SERVER_FILE).unlink()


def find_advertised(state_dir: Path) -> RunningServer | None:
    try:
        data = json.loads((state_dir / SERVER_FILE).read_text())
        return RunningServer(url=str(data["url"]), token=str(data["token"]), pid=int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_running_server(state_dir: Path) -> RunningServer | None:
    """The server serving this state folder, if one is alive and answering."""
    server = find_advertised(state_dir)
    if server is None or not _alive(server.pid):
        return None
    try:
        healthy = httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return None
    return server if healthy else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
