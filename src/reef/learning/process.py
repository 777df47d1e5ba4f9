"""The learning worker as a separate process, started and stopped by `reef serve`.

The worker loads no model: its proposer and the gate's evaluations run on the server's engine,
over loopback with the server's internal token (one model per machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from multiprocessing.process import BaseProcess

from reef.config import ReefConfig
from reef.inference.model import ServerModel
from reef.inference.server_file import RunningServer
from reef.learning.recipe import load_recipe
from reef.learning.worker import LearningWorker
from reef.store import ExperienceStore

log = logging.getLogger("reef.learning")


def start_worker(config: ReefConfig, server: RunningServer) -> BaseProcess:
    """A fresh interpreter (spawn), so nothing of the server's threads or model is inherited."""
    process = multiprocessing.get_context("spawn").Process(
        target=worker_main, args=(config, server), name="reef-learning", daemon=True
    )
    process.start()
    return process


def stop_worker(process: BaseProcess, timeout: float = 30.0) -> None:
    if process.is_alive():
        process.terminate()  # SIGTERM: the worker finishes its await point and exits
        process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()


def worker_main(config: ReefConfig, server: RunningServer) -> None:
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s learning %(levelname)s %(message)s",
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_worker(config, server))


async def run_worker(config: ReefConfig, server: RunningServer) -> None:
    assert config.learning.recipe is not None
    recipe = load_recipe(config.learning.recipe, config.learning.recipe_settings())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_stop_when_orphaned(stop))
    store = ExperienceStore(config.experience_db, config.store.synchronous)
    model = ServerModel(server.url, server.token)
    try:
        log.info(
            "recipe %s learning on %s (%s mode)",
            recipe.name,
            ", ".join(config.learning.scenarios),
            config.learning.mode,
        )
        await LearningWorker(config, store, recipe, model).run(stop)
    finally:
        watcher.cancel()
        await model.close()
        store.close()


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A server killed with -9 cannot stop its worker: the worker notices and stops itself."""
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the server is gone: the learning worker stops")
            stop.set()
        await asyncio.sleep(1)
