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
from typing import Protocol

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
