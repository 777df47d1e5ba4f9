"""`reef serve` in the test's own process: the whole serve path (the config read from the
folder's reef.yaml and the environment given, the store, the release workflow, the followers,
the server file, the learning worker where one is configured, uvicorn on a loopback port) with
the engine a test gives, a `ScriptedEngine` by default, served from a thread.

It starts in milliseconds where a `reef serve` process takes seconds (and the real model more),
and the test can reach into the server's state. What needs the process itself (signals, a crash,
the CLI, the real engine) starts one (`reef.testing.processes`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.config import ReefConfig, load_config
from reef.daemon.run import ReefServer, serve
from reef.engines.base import Engine
from reef.releases.workflow import ReleaseWorkflow
from reef.server.state import ServerState
from reef.store import ExperienceStore
from reef.testing.processes import free_port
from reef.testing.scripted_engine import ScriptedEngine

START_TIMEOUT_S = 60.0


@dataclass
class InProcessReef:
    """A Reef serving from a thread of this process (what a `ServerProcess` offers a test)."""

    url: str
    cwd: Path
    state: ServerState

    @property
    def config(self) -> ReefConfig:
        return self.state.config

    @property
    def engine(self) -> Engine:
        return self.state.engine


@contextmanager
def reef_in_process(
    cwd: Path,
    engine: Engine | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Iterator[InProcessReef]:
    """Serve the project in `cwd` (its reef.yaml, written empty when there is none) until the
    block ends. `engine`: what serves (a `ScriptedEngine` when None). `env` replaces the
    environment the config reads (tokens: REEF_TOKEN, REEF_ADMIN_TOKEN). What the server logs
    goes to Python's logging, where pytest's `caplog` reads it."""
    path = cwd / "reef.yaml"
    if not path.exists():
        path.write_text("{}\n")
    port = free_port()
    config = load_config(path, {**(overrides or {}), "server.port": port}, env=env or {})
    store = ExperienceStore(config.experience_store, config.store.synchronous)
    state = ServerState(
        config=config,
        engine=engine or ScriptedEngine(),
        store=store,
        workflow=ReleaseWorkflow(config, store),
        engine_reason="given by the test",
    )
    server = ReefServer(state)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(serve(state, server))
        except BaseException as error:  # shown to the test that waits for the start
            failure.append(error)

    thread = threading.Thread(target=run, name=f"reef-in-process-{port}", daemon=True)
    thread.start()
    _wait_started(server, thread, failure)
    try:
        yield InProcessReef(f"http://127.0.0.1:{port}", cwd, state)
    finally:
        server.should_exit = True
        thread.join(60)


def _wait_started(
    server: ReefServer, thread: threading.Thread, failure: list[BaseException]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if failure:
        raise RuntimeError(f"Reef did not start in process: {failure[0]!r}") from failure[0]
    if not server.started:
        server.should_exit = True
        raise RuntimeError(f"Reef did not start in process within {START_TIMEOUT_S:.0f} s")
