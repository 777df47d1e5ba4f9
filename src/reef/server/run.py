"""Run the server in the foreground: start the engine, bind, serve until Ctrl-C, close cleanly."""

from __future__ import annotations

import asyncio

import uvicorn

from reef.errors import ConfigurationRefused
from reef.learning.process import start_worker, stop_worker
from reef.server.app import create_app
from reef.server.auth import is_loopback
from reef.server.follower import follow_heads, load_heads
from reef.server.state import ServerState


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
    follower = None
    learner = start_worker(state.config) if state.config.learning.recipe else None
    try:
        await state.engine.start()
        known: dict[str, str] = {}
        await asyncio.to_thread(load_heads, state, known)
        follower = asyncio.create_task(follow_heads(state, known))
        try:
            config = uvicorn.Config(
                create_app(state),
                host=server_config.host,
                port=server_config.port,
                log_level=server_config.log_level,
                timeout_graceful_shutdown=60,
                lifespan="off",
            )
            await uvicorn.Server(config).serve()
        finally:
            await state.engine.close()
    finally:
        if follower is not None:
            follower.cancel()
        if learner is not None:
            await asyncio.to_thread(stop_worker, learner)
        state.store.close()


def run(state: ServerState) -> None:
    asyncio.run(serve(state))
