"""The learning worker as a separate process, started and stopped by `reef serve`.

The worker loads no model: its proposer and the gate's evaluations run on the server's engine,
over loopback with the server's internal token (one model per machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable

from reef.config import ReefConfig
from reef.inference.model import ServerModel
from reef.inference.server_file import RunningServer
from reef.learning.worker import LearningWorker
from reef.store import ExperienceStore
from reef.tracing import start_tracing

log = logging.getLogger("reef.learning")


def start_worker(config: ReefConfig, server: RunningServer) -> subprocess.Popen[bytes]:
    """A fresh interpreter, so nothing of the server's threads or model is inherited. The config
    and the server's internal token travel on its standard input, never in its arguments or
    environment (which other users can read)."""
    # Training recipes run torch here: passive OpenMP threads do not spin-wait on the cores the
    # server's engine needs.
    environment = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    process = subprocess.Popen(
        [sys.executable, "-m", "reef.daemon.learner"], stdin=subprocess.PIPE, env=environment
    )
    assert process.stdin is not None
    process.stdin.write(pickle.dumps((config, server)))
    process.stdin.close()
    return process


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if process.poll() is None:
        process.terminate()  # SIGTERM: the worker finishes its await point and exits
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def worker_main(config: ReefConfig, server: RunningServer) -> None:
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s learning %(levelname)s %(message)s",
    )
    if config.server.log_level != "debug":
        # httpx logs each of the worker's internal calls to the server at info (issue 75).
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_worker(config, server))


async def run_worker(config: ReefConfig, server: RunningServer) -> None:
    """Learn until SIGTERM/SIGINT or the server's death, which stop the worker at once: a step
    in flight is cancelled (its internal requests are dropped by the server, its candidate ends
    rejected), so a stopping server never waits for a learning step."""
    store = ExperienceStore(config.experience_store, config.store.synchronous)
    model = ServerModel(server.url, server.token)
    worker = LearningWorker(config, store, model)
    # Each step, its gate and its publish, one trace per step (`reef.tracing`).
    worker.workflow.tracing = start_tracing(config.otel, os.environ)
    stop = asyncio.Event()
    learning = asyncio.create_task(worker.run(stop))

    def stop_now() -> None:
        stop.set()
        learning.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_now)
    watcher = asyncio.create_task(_stop_when_orphaned(stop_now))
    for lane in worker.lanes.values():
        recipes = ", ".join(learner.recipe.name for learner in lane.learners)
        log.info("%s learns with %s (%s mode)", lane.scenario, recipes, lane.mode)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await learning
    finally:
        watcher.cancel()
        await model.close()
        store.close()
        if worker.workflow.tracing is not None:
            worker.workflow.tracing.shutdown()  # the last spans, exported


async def _stop_when_orphaned(stop_now: Callable[[], None]) -> None:
    """A server killed with -9 cannot stop its worker: the worker notices and stops itself."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1)
    log.warning("the server is gone: the learning worker stops")
    stop_now()


if __name__ == "__main__":
    worker_main(*pickle.loads(sys.stdin.buffer.read()))
