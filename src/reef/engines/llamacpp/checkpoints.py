"""Checkpoint models loaded beside the served one: full weights of a `checkpoint` release (a
whole-model GGUF), each served by an engine of its own with the served engine's settings (its
own slots and KV cache), loaded on first use or when a release is about to serve it.

The most recently used `MAX_CHECKPOINTS` stay loaded; one that goes is closed only when its last
request in flight has finished, so a hot-swap never cuts an answer short. Background work (a
shadow's copy) never unloads a checkpoint a live request used: it loads one only into a free
place, or in the place of one that only background work used, and those go first when a live
request needs a place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from reef.errors import EngineUnavailable, Overloaded, Unsupported

log = logging.getLogger("reef.engine")

MAX_CHECKPOINTS = 2  # checkpoint models kept loaded beside the engine's own
RETIRE_POLL_S = 0.1  # how often a checkpoint model that went checks for its last request


class CheckpointEngine(Protocol):
    """What the pool needs of an engine serving a checkpoint."""

    model_path: Path

    @property
    def model(self) -> str: ...  # the name clients use: its release's

    @property
    def admitted(self) -> int: ...  # its own requests running or waiting

    async def start(self) -> None: ...

    async def close(self) -> None: ...


E = TypeVar("E", bound=CheckpointEngine)


class CheckpointPool(Generic[E]):
    """The checkpoint engines loaded (most recently used last) and those loading, made by
    `spawn(gguf, checkpoint)` (on the event loop)."""

    def __init__(self, spawn: Callable[[Path, Path], E]) -> None:
        self._spawn = spawn
        self._loaded: OrderedDict[Path, E] = OrderedDict()
        self._loading: dict[Path, asyncio.Task[E]] = {}
        self._retiring: dict[asyncio.Task[None], E] = {}
        self._live: set[Path] = set()  # loaded ones a live request has asked for

    @property
    def names(self) -> list[str]:
        """The checkpoint models loaded, by their releases' names."""
        return [engine.model for engine in self._loaded.values()]

    async def get(self, checkpoint: Path, background: bool = False) -> E:
        """The engine serving `checkpoint` (a checkpoint release's folder, or its GGUF), loaded
        now if it is not: requests for it wait for the load, others go on. `background`: for
        background work, which never takes the place of a checkpoint a live request used
        (`Overloaded` when there is no other)."""
        path = checkpoint_gguf(checkpoint)
        if not background:
            self._live.add(path)
        elif path not in self._loaded and not self._room_for_background():
            raise Overloaded(
                f"the {MAX_CHECKPOINTS} checkpoint models loaded serve live requests: background "
                f"work on {checkpoint} would unload one, so it waits",
                headers={"retry-after": "5"},
            )
        if path in self._loaded:
            self._loaded.move_to_end(path)
            return self._loaded[path]
        if path not in self._loading:
            task = asyncio.create_task(self._load(path, checkpoint))
            self._loading[path] = task
            task.add_done_callback(lambda _: self._loading.pop(path, None))
        return await asyncio.shield(self._loading[path])

    async def close(self) -> None:
        for loading in list(self._loading.values()):
            loading.cancel()
        for retiring, engine in list(self._retiring.items()):
            retiring.cancel()
            await engine.close()
        while self._loaded:
            _, engine = self._loaded.popitem()
            await engine.close()

    async def _load(self, path: Path, checkpoint: Path) -> E:
        engine = self._spawn(path, checkpoint)
        started = time.perf_counter()
        try:
            await engine.start()
        except EngineUnavailable as error:  # `load_model`: not a GGUF, or one llama.cpp refused
            await engine.close()
            raise Unsupported(
                f"llama.cpp could not load the checkpoint {path} ({error.message}): a "
                "checkpoint's checkpoint/*.gguf must be a whole model of the same vocabulary"
            ) from None
        log.info("llama.cpp: loaded checkpoint %s in %.1f s", path, time.perf_counter() - started)
        self._loaded[path] = engine
        while len(self._loaded) > MAX_CHECKPOINTS:
            oldest = self._loaded.pop(self._next_to_unload())
            retiring = asyncio.create_task(_close_when_idle(oldest))
            self._retiring[retiring] = oldest
            retiring.add_done_callback(lambda done: self._retiring.pop(done, None))
        return engine

    def _room_for_background(self) -> bool:
        """Whether a checkpoint can be loaded for background work without unloading one that
        a live request used."""
        loaded = len(self._loaded) + len(self._loading)
        background_only = [p for p in self._loaded if p not in self._live]
        return loaded < MAX_CHECKPOINTS or bool(background_only)

    def _next_to_unload(self) -> Path:
        """The least recently used checkpoint only background work used, else the least recently
        used."""
        order = list(self._loaded)
        chosen = next((p for p in order if p not in self._live), order[0])
        self._live.discard(chosen)
        return chosen


def checkpoint_gguf(checkpoint: Path) -> Path:
    """The whole-model GGUF of a checkpoint: the file itself, or the first `*.gguf` in the
    folder."""
    if checkpoint.is_file():
        return checkpoint
    found = sorted(checkpoint.glob("*.gguf"))
    if not found:
        raise Unsupported(
            f"checkpoint {checkpoint} has no whole-model .gguf, which llama.cpp needs (a Hugging "
            "Face folder serves on vLLM)"
        )
    return found[0]


async def _close_when_idle(engine: CheckpointEngine) -> None:
    """Close a checkpoint model no release serves once its requests in flight have finished."""
    while engine.admitted:  # its own requests, not those beside it
        await asyncio.sleep(RETIRE_POLL_S)
    await engine.close()
    log.info("llama.cpp: unloaded checkpoint %s", engine.model_path)
