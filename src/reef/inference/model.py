"""A model to run requests on under a binding: the engine in this process, or the server's.

One model per machine: while `reef serve` runs, it owns the engine (a model in memory, or a vLLM
child), and everything else that needs the model (the learning worker's proposer and gate,
`reef release publish`) asks that server over loopback with its internal token. `ServerModel`
does that; `LocalModel` wraps an engine this process loaded itself, for when no server runs.

Requests run this way are never recorded as traffic: the server answers them on an internal
route that skips the experience store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from reef.client import AsyncReefClient, ReefClientError
from reef.config import ReefConfig
from reef.engines import build_engine
from reef.engines.base import Engine
from reef.errors import EngineUnavailable, ReefError
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.server_file import find_running_server
from reef.protocol import ChatRequest, Completion

INTERNAL_COMPLETE_PATH = "/reef/internal/complete"
# A server that is flooded answers 503 with Retry-After; internal calls wait and try again.
OVERLOAD_RETRIES = 20


class Model(Protocol):
    name: str

    async def complete(self, request: ChatRequest, binding: Binding = BASE_BINDING) -> Completion:
        """The completion of `request` as the engine serves it under `binding`."""
        ...

    async def close(self) -> None: ...


def answer_text(completion: Completion) -> str:
    message = completion.response["choices"][0]["message"]
    return str(message.get("content") or "")


class LocalModel:
    """An engine loaded in this process (only when no server is running)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = f"{engine.name} in this process"

    async def complete(self, request: ChatRequest, binding: Binding = BASE_BINDING) -> Completion:
        return await self.engine.complete(
            binding.apply(request), adapter=binding.adapter, checkpoint=binding.checkpoint
        )

    async def close(self) -> None:
        await self.engine.close()


class ServerModel:
    """The running server's engine, over loopback, with the server's internal token."""

    def __init__(self, url: str, token: str, timeout_s: float = 900.0) -> None:
        self.url = url.rstrip("/")
        self.name = f"the server at {self.url}"
        self._client = AsyncReefClient(self.url, token, timeout_s=timeout_s)

    async def complete(self, request: ChatRequest, binding: Binding = BASE_BINDING) -> Completion:
        applied = binding.apply(request)
        body = {
            "request": applied.model_dump(exclude_none=True),
            "adapter": str(binding.adapter) if binding.adapter else None,
            "checkpoint": str(binding.checkpoint) if binding.checkpoint else None,
        }
        data = await self._post(body)
        return Completion(
            response=data["response"],
            model=data["model"],
            token_ids=data.get("token_ids"),
            token_logprobs=data.get("token_logprobs"),
            ttft_ms=data.get("ttft_ms"),
            prompt_token_ids=data.get("prompt_token_ids"),
        )

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(OVERLOAD_RETRIES):
            try:
                data: dict[str, Any] = await self._client.post(INTERNAL_COMPLETE_PATH, body)
                return data
            except ReefClientError as error:
                if error.status == 503 and error.retry_after is not None:
                    await asyncio.sleep(_seconds(error.retry_after))
                    continue
                raise self._failure(error) from None
        raise EngineUnavailable(f"{self.name} stayed overloaded; try again when it is quieter")

    def _failure(self, error: ReefClientError) -> ReefError:
        if error.status is None:
            return EngineUnavailable(
                f"could not reach {self.name}: {error.message}; is `reef serve` still running?"
            )
        return ReefError(
            f"{self.name} refused an internal request ({error.status}): {error.message}",
            status=error.status if error.status < 500 else 502,
        )

    async def close(self) -> None:
        await self._client.aclose()


def completion_json(completion: Completion) -> dict[str, Any]:
    """What the internal route answers: the completion with what training needs."""
    return {
        "response": completion.response,
        "model": completion.model,
        "token_ids": completion.token_ids,
        "token_logprobs": completion.token_logprobs,
        "ttft_ms": completion.ttft_ms,
        "prompt_token_ids": completion.prompt_token_ids,
    }


def artifact_inside(path: str | None, state_dir: Path, what: str = "adapter") -> Path | None:
    """An adapter or checkpoint folder named by an internal caller, which must lie inside the
    state folder (candidates and release checkouts live there): the route never loads files
    from elsewhere."""
    if path is None:
        return None
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(state_dir.resolve()):
        raise ReefError(
            f"{what} {path} is outside the state folder {state_dir}: internal requests "
            "load candidates and releases only",
            status=400,
        )
    return resolved


def _seconds(value: str) -> float:
    try:
        return min(30.0, max(0.1, float(value)))
    except ValueError:
        return 1.0


@contextlib.asynccontextmanager
async def open_model(config: ReefConfig) -> AsyncIterator[Model]:
    """The running server's engine when a server serves this state folder; otherwise the
    configured engine, loaded here for as long as the block runs."""
    server = await asyncio.to_thread(find_running_server, config.state_dir)
    model: Model
    if server is not None:
        model = ServerModel(server.url, server.token)
    else:
        engine = build_engine(config.engine, config.server.max_queue, config.state_dir)
        await engine.start()
        model = LocalModel(engine)
    try:
        yield model
    finally:
        await model.close()
