"""The sandbox's one way out: Reef's port, relayed over a Unix socket.

Inside, the sandbox has a network namespace of its own (only `lo`, nothing routed), where
`inside` listens on 127.0.0.1:PORT and relays each connection to a Unix socket bound into the
sandbox. Outside, `OutsideRelay` accepts on that socket and connects to 127.0.0.1:PORT, Reef's
port and nothing else: no address or port is ever read from the sandbox, so no other one can be
reached.

Standard library only: the sandbox runs this file as a script with the host's Python,
`python relay.py SOCKET PORT -- COMMAND…` (it relays while COMMAND runs, and exits with its code).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

CHUNK = 65536


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy `source` to `target` until `source` ends, then end `target`'s writing side."""
    try:
        while data := source.recv(CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def splice(left: socket.socket, right: socket.socket) -> None:
    """Relay both ways until both sides are done, then close both."""
    back = threading.Thread(target=pump, args=(right, left), daemon=True)
    back.start()
    pump(left, right)
    back.join()
    left.close()
    right.close()


def serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on `listener` for ever, splicing each connection to a fresh `connect()`."""
    while True:
        try:
            accepted, _ = listener.accept()
        except OSError:
            return  # the listener was closed
        try:
            onward = connect()
        except OSError:
            accepted.close()
            continue
        threading.Thread(target=splice, args=(accepted, onward), daemon=True).start()


class OutsideRelay:
    """Accepts on the Unix socket `path` and relays to 127.0.0.1:`port`, in threads."""

    def __init__(self, path: Path, port: int, owner: int | None = None) -> None:
        self.path = path
        self.port = port
        self.owner = owner  # the uid the sandbox runs as, which must connect to the socket
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def _connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=None)

    def __enter__(self) -> OutsideRelay:
        self.listener.bind(str(self.path))
        if self.owner is not None:
            os.chown(self.path, self.owner, -1)
        self.listener.listen(64)
        threading.Thread(target=serve, args=(self.listener, self._connect), daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.listener.close()
        self.path.unlink(missing_ok=True)


def inside(socket_path: str, port: int, command: list[str]) -> int:
    """Listen on 127.0.0.1:`port`, relaying to `socket_path`, while `command` runs."""

    def connect() -> socket.socket:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.connect(socket_path)
        return unix

    listener = socket.create_server(("127.0.0.1", port), backlog=64)
    threading.Thread(target=serve, args=(listener, connect), daemon=True).start()
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + signal


if __name__ == "__main__":
    split = sys.argv.index("--")
    sys.exit(inside(sys.argv[1], int(sys.argv[2]), sys.argv[split + 1 :]))
