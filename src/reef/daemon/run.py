"""Run the server in the foreground: start the engine, bind, serve until Ctrl-C, close cleanly.

Once it listens, the server advertises itself in `.reef/server.json` (URL and internal token) and
starts the learning worker, which uses this server's engine over loopback: one model per machine.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
from collections.abc import Callable

import uvicorn

from reef.daemon.canary_judge import CanaryJudge
from reef.daemon.follower import HeadFollower
from reef.daemon.learner import start_worker, stop_worker
from reef.daemon.recovery import InterruptedRecovery
from reef.daemon.remote_follower import RemoteFollower
from reef.daemon.shadow import ShadowRunner
from reef.errors import ConfigurationRefused
from reef.inference.server_file import RunningServer, advertise, loopback_url, withdraw
from reef.server.app import create_app
from reef.server.auth import is_loopback
from reef.server.state import ServerState
from reef.server.teacher import teachers_of


def check_bind(host: str, has_tokens: bool) -> None:
    """Refuse to listen beyond loopback without a token: anyone reaching the port could use it."""
    if not has_tokens and not is_loopback(host):
        raise ConfigurationRefused(
            f"refusing to listen on {host} without a token: anyone who can reach it could use the "
            "model and read every record. Set REEF_TOKEN (or server.tokens), or bind to 127.0.0.1"
        )


def check_port_free(host: str, port: int) -> None:
    """Refuse before anything loads when another process already listens on `host:port`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return  # uvicorn says what else is wrong with the address
            raise ConfigurationRefused(
                f"port {port} on {host} is in use (another `reef serve`, or another server): "
                "stop it, or serve on another port with --port or server.port in reef.yaml"
            ) from None


async def serve(
    state: ServerState,
    server: ReefServer | None = None,
    announce: Callable[[], None] | None = None,
) -> None:
    """Start the engine, serve until SIGINT/SIGTERM (in-flight requests finish), then close.
    `server`: the uvicorn server to serve with, for a caller that stops it itself (a test
    serving in a thread sets its `should_exit`); `announce`: called once the engine has
    started, before the socket opens (an engine that fails to start is never said to serve)."""
    followers: list[asyncio.Task[None]] = []
    try:
        await state.engine.start()
        await asyncio.to_thread(state.workflow.recover_interrupted)
        if state.workflow.chain.remote is not None:
            remote = RemoteFollower(state)
            await asyncio.to_thread(remote.catch_up)  # serve the shared heads from the start
            followers.append(asyncio.create_task(remote.follow()))
        heads = HeadFollower(state)
        await asyncio.to_thread(heads.load_heads)
        followers.append(asyncio.create_task(heads.follow()))
        followers.append(asyncio.create_task(CanaryJudge(state).follow()))
        followers.append(asyncio.create_task(InterruptedRecovery(state).follow()))
        state.shadows = ShadowRunner(state)
        followers.append(asyncio.create_task(state.shadows.follow()))
        state.teachers = teachers_of(state.config, _scenarios(state))
        for teacher in state.teachers.values():
            await teacher.start()
        if announce is not None:
            announce()
        try:
            await (server or ReefServer(state)).serve()
        finally:
            for teacher in state.teachers.values():
                await teacher.close()
            await state.engine.close()
    finally:
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        if state.tracing is not None:
            await asyncio.to_thread(state.tracing.shutdown)  # the last spans, exported
        # A cancelled follower leaves what it handed to a thread running (a release's probe
        # reading the store): every such job ends before the store closes under it, which
        # crashed the process inside SQLite (seen as an xdist worker dying in the suite).
        await asyncio.get_running_loop().shutdown_default_executor()
        state.store.close()


def _scenarios(state: ServerState) -> list[str]:
    """Every scenario the configuration names (a teacher may belong to any of them)."""
    config = state.config
    return list(dict.fromkeys(["default", *config.learning.scenarios, *config.scenarios]))


class ReefServer(uvicorn.Server):
    """uvicorn, plus what belongs to the socket's life. As it opens: the server file is written
    before any request is answered (whoever sees /healthz answer also finds it), then the learning
    worker starts. As it closes: both go before the graceful shutdown waits for requests in
    flight, so it never waits for a learning step."""

    def __init__(self, state: ServerState) -> None:
        server_config = state.config.server
        super().__init__(
            uvicorn.Config(
                create_app(state),
                host=server_config.host,
                port=server_config.port,
                log_level=server_config.log_level,
                access_log=server_config.access_log,
                timeout_graceful_shutdown=60,
                lifespan="off",
            )
        )
        self.state = state
        self.running = RunningServer(
            url=loopback_url(server_config.host, server_config.port),
            token=state.internal_token,
            pid=os.getpid(),
        )
        self.learner: subprocess.Popen[bytes] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        advertise(self.state.config.state_dir, self.running)  # no await since listening
        if self.state.config.learning_plans():
            self.learner = start_worker(self.state.config, self.running)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        withdraw(self.state.config.state_dir, self.running)
        if self.learner is not None:
            self.learner.terminate()  # its requests in flight are dropped, not waited for
        await super().shutdown(sockets)
        if self.learner is not None:
            await asyncio.to_thread(stop_worker, self.learner)


def run(state: ServerState, announce: Callable[[], None] | None = None) -> None:
    with asyncio.Runner(loop_factory=_fast_loop()) as runner:
        runner.run(serve(state, announce=announce))


def _fast_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (not on Windows): each request's socket reads,
    writes and wake-ups cost several times less than on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
