"""Run the server in the foreground: start the engine, bind, serve until Ctrl-C, close cleanly.

Once it listens, the server advertises itself in `.reef/server.json` (URL and internal token) and
starts the learning worker, which uses this server's engine over loopback: one model per machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from multiprocessing.process import BaseProcess
from pathlib import Path

import uvicorn

from reef.errors import ConfigurationRefused
from reef.inference.server_file import RunningServer, advertise, loopback_url, withdraw
from reef.learning.process import start_worker, stop_worker
from reef.server.app import create_app
from reef.server.auth import is_loopback
from reef.server.follower import HeadFollower
from reef.server.state import ServerState

STARTUP_POLL_S = 0.05


def check_bind(host: str, has_tokens: bool) -> None:
    """Refuse to listen beyond loopback without a token: anyone reaching the port could use it."""
    if not has_tokens and not is_loopback(host):
        raise ConfigurationRefused(
            f"refusing to listen on {host} without a token: anyone who can reach it could use the "
            "model and read every record. Set REEF_TOKEN (or server.tokens), or bind to 127.0.0.1"
        )


async def serve(state: ServerState) -> None:
    """Start the engine, serve until SIGINT/SIGTERM (in-flight requests finish), then close."""
    server_config = state.config.server
    running = RunningServer(
        url=loopback_url(server_config.host, server_config.port),
        token=state.internal_token,
        pid=os.getpid(),
    )
    learner: list[BaseProcess] = []
    follower = announcer = None
    try:
        await state.engine.start()
        await asyncio.to_thread(state.workflow.recover_interrupted)
        heads = HeadFollower(state)
        await asyncio.to_thread(heads.load_heads)
        follower = asyncio.create_task(heads.follow())
        server = _AdvertisedServer(
            running,
            state.config.state_dir,
            uvicorn.Config(
                create_app(state),
                host=server_config.host,
                port=server_config.port,
                log_level=server_config.log_level,
                timeout_graceful_shutdown=60,
                lifespan="off",
            ),
        )
        announcer = asyncio.create_task(_once_listening(server, state, running, learner))
        try:
            await server.serve()
        finally:
            announcer.cancel()
            await asyncio.to_thread(withdraw, state.config.state_dir, running)
            for process in learner:
                await asyncio.to_thread(stop_worker, process)
            await state.engine.close()
    finally:
        if follower is not None:
            follower.cancel()
        state.store.close()


class _AdvertisedServer(uvicorn.Server):
    """Writes `.reef/server.json` as soon as the socket listens, before any request is
    answered: whoever sees /healthz answer also finds the server file."""

    def __init__(self, running: RunningServer, state_dir: Path, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.running = running
        self.state_dir = state_dir

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            advertise(self.state_dir, self.running)  # no await in between: no request yet


async def _once_listening(
    server: uvicorn.Server, state: ServerState, running: RunningServer, learner: list[BaseProcess]
) -> None:
    """Start the learning worker once the server accepts calls."""
    while not server.started:
        await asyncio.sleep(STARTUP_POLL_S)
    if state.config.learning.recipe:
        with contextlib.suppress(asyncio.CancelledError):
            learner.append(start_worker(state.config, running))


def run(state: ServerState) -> None:
    asyncio.run(serve(state))
