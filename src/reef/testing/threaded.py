"""An ASGI app served by uvicorn on loopback from a thread of this process: a test's upstream
whose handlers can record what they were sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from reef.testing.processes import free_port


@contextmanager
def served_in_thread(app: Any, what: str = "the app", timeout: float = 30) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL, http://127.0.0.1:PORT."""
    server = uvicorn.Server(uvicorn.Config(app, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, f"{what} did not start in {timeout:.0f} s"
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
