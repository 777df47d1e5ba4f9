"""The outside relay, the runner's end of the sandbox's one way out: it relays both ways to
Reef's port, on one thread whatever the connections, and closes those past MAX_CONNECTIONS
(issue 74: 2,500 connections to an episode's socket gave the runner 5,004 threads). Real Unix
and TCP sockets on loopback; the peer is an echo server."""

from __future__ import annotations

import selectors
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.episodes.relay import MAX_CONNECTIONS, OutsideRelay


@pytest.fixture
def echo_port() -> Iterator[int]:
    """An echo server on one thread (a selector), so that the threads the test counts are the
    relay's."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    chooser = selectors.DefaultSelector()
    chooser.register(server, selectors.EVENT_READ)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for key, _ in chooser.select(timeout=0.1):
                if key.fileobj is server:
                    connection, _ = server.accept()
                    chooser.register(connection, selectors.EVENT_READ)
                    continue
                connection = key.fileobj  # type: ignore[assignment]
                data = connection.recv(65536)
                if data:
                    connection.sendall(data)
                else:
                    chooser.unregister(connection)
                    connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(path))
    return client


def test_the_relay_echoes_on_one_thread_and_closes_connections_past_its_bound(
    echo_port: int,
) -> None:
    with tempfile.TemporaryDirectory(prefix="reef-", dir="/tmp") as folder:
        path = Path(folder) / "reef.sock"
        before = threading.active_count()
        with OutsideRelay(path, echo_port) as relay:
            first = connect(path)
            first.sendall(b"hello")
            assert first.recv(5) == b"hello"
            held = [first] + [connect(path) for _ in range(MAX_CONNECTIONS - 1)]
            for client in held[1:]:
                client.sendall(b"x")
                assert client.recv(1) == b"x"  # each one relayed, so each one counted open
            extra = [connect(path) for _ in range(20)]
            assert all(client.recv(1) == b"" for client in extra)  # closed at once
            assert relay.open == MAX_CONNECTIONS and relay.refused == 20
            assert threading.active_count() - before == 1  # the relay's one thread
            for client in held + extra:
                client.close()
