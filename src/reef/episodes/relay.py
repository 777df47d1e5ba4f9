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

import asyncio
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


MAX_CONNECTIONS = 64  # an episode's connections open at once through the outside relay


class OutsideRelay:
    """Accepts on the Unix socket `path` and relays to 127.0.0.1:`port`: one thread, one event
    loop, at most `MAX_CONNECTIONS` connections at once (more are closed as they come). The
    runner is outside the episode's cgroup: a thread per connection would let an agent that
    opens thousands make the runner hold thousands of threads (issue 74: 2,500 connections,
    5,004 threads)."""

    def __init__(self, path: Path, port: int, owner: int | None = None) -> None:
        self.path = path
        self.port = port
        self.owner = owner  # the uid the sandbox runs as, which must connect to the socket
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.open = 0  # connections relayed now
        self.refused = 0  # connections closed for being one too many
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()  # set from __exit__, on the loop's thread
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OutsideRelay:
        self.listener.bind(str(self.path))
        if self.owner is not None:
            os.chown(self.path, self.owner, -1)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=5)
        self.listener.close()
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        server = await asyncio.start_unix_server(self._relay, sock=self.listener)
        await self._stop.wait()
        server.close()
        open_now = asyncio.all_tasks() - {asyncio.current_task()}
        for task in open_now:
            task.cancel()  # connections still open when the episode ends
        await asyncio.gather(*open_now, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            self.refused += 1
            writer.close()
            return
        self.open += 1
        onward: asyncio.StreamWriter | None = None
        try:
            onward_reader, onward = await asyncio.open_connection("127.0.0.1", self.port)
            await asyncio.gather(_pipe(reader, onward), _pipe(onward_reader, writer))
        except OSError:
            pass  # Reef's port refused or reset: the agent sees its connection end
        finally:
            self.open -= 1
            for end in (writer, onward):
                if end is not None:
                    end.close()


async def _pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    """Copy `source` to `target` until `source` ends, then end `target`'s writing side."""
    try:
        while data := await source.read(CHUNK):
            target.write(data)
            await target.drain()
        if target.can_write_eof():
            target.write_eof()
    except OSError:
        pass


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
