"""The Engine contract: what every serving engine (llama.cpp, vLLM, an upstream) offers.

An engine turns one validated chat request (`reef.protocol.ChatRequest`) into either a whole
`Completion` or a stream of `chat.completion.chunk` objects that ends with the assembled
`Completion`. It says what it can capture (token ids, logprobs) so the experience store knows
what training can count on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reef.protocol import ChatRequest, Completion, StreamItem


class Cancelled(Exception):
    """The client went away; the generation stopped early and is not a completion."""


class Preempted(Cancelled):
    """A background job (a shadow's copy, a gate's task) gave its place to a live request."""


@dataclass(frozen=True)
class Capabilities:
    token_ids: bool = False
    logprobs: bool = False
    # A checkpoint's weights load beside the served ones (llama.cpp), rather than in their
    # place (vLLM holds one set): background work may use a checkpoint only where they do.
    checkpoints_beside: bool = False


class Engine(Protocol):
    name: str
    capabilities: Capabilities

    @property
    def model(self) -> str: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def complete(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> Completion:
        """The whole completion. `adapter`: a LoRA adapter to serve with; `checkpoint`: a
        checkpoint release's full weights to serve on instead of the engine's model."""
        ...

    def stream(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        """Chunks, then the assembled Completion; `adapter` and `checkpoint` as for complete."""
        ...


# What some engines offer besides the contract. A caller asks with `isinstance(engine, X)`
# (each is runtime-checkable), never by probing for a name.


@runtime_checkable
class ForwardsJson(Protocol):
    """An upstream: the OpenAI routes besides chat (`/completions`, `/embeddings`) forwarded
    whole to the server behind it."""

    async def forward_json(
        self,
        path: str,
        body: dict[str, Any],
        adapter: Path | None = None,
        checkpoint: Path | None = None,
    ) -> dict[str, Any]: ...


@runtime_checkable
class Embeds(Protocol):
    """An engine that embeds texts itself (or token ids of its own vocabulary, as OpenAI's
    `input` may be): the vectors, and the tokens they took."""

    async def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]: ...


@runtime_checkable
class LoadsCheckpoints(Protocol):
    """An engine that loads a checkpoint release's weights beside its own, ahead of the first
    request for them."""

    async def load_checkpoint(self, checkpoint: Path, background: bool = False) -> object: ...


@runtime_checkable
class Slotted(Protocol):
    """An engine that schedules requests on slots of its own (llama.cpp): what it holds and
    runs, its KV cache and prompt cache, and the background work it fits into idle slots."""

    slots: int
    runs_background: bool

    @property
    def in_flight(self) -> int: ...

    @property
    def slots_busy(self) -> int: ...

    @property
    def kv_cache_usage(self) -> float: ...

    @property
    def cache_counters(self) -> dict[str, int]: ...

    @property
    def loops_stopped(self) -> int: ...

    @property
    def kv_cache(self) -> dict[str, Any]: ...

    @property
    def prefill(self) -> dict[str, Any]: ...

    @property
    def checkpoints_loaded(self) -> list[str]: ...


@runtime_checkable
class ServesChildMetrics(Protocol):
    """An engine that runs a server of its own (vLLM) whose Prometheus text Reef passes on."""

    async def child_metrics(self) -> bytes: ...
