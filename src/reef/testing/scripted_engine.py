"""A scripted engine: the Engine contract (reef.engines.base) in the test's own process, whose
answers are known in advance.

Everything that is not about the real engine (the protocol's shapes, validation, auth, errors,
routing, records and reports, releases served) is tested on it in milliseconds: its answer is
what `script` says, cut to `max_tokens` and at `stop` as an engine cuts it, split into one
token per word (with its leading space), each with a log-probability of -0.5 where logprobs are
asked; the prompt it read is a token per word of every message (a harness's system prompt
included), so a longer prompt reads as more tokens. `calls` keeps what it was asked, with the
adapter and checkpoint it was asked to serve with, so a test can see what a release bound.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.engines.base import Capabilities
from reef.protocol import ChatRequest, ChunkFactory, Completion, StreamItem, message_text

# What the script answers: text, or a whole assistant message (content and/or tool_calls).
Answer = str | dict[str, Any]
Script = Callable[[ChatRequest], Answer]
TOKEN_LOGPROB = -0.5
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ScriptedCall:
    request: ChatRequest
    adapter: Path | None
    checkpoint: Path | None


class ScriptedEngine:
    """Answers each chat request with `script(request)` (or the same text every time)."""

    name = "scripted"

    def __init__(
        self,
        script: Script | str = "Hello from the script.",
        model: str = "scripted",
        delay_s: float = 0.0,
    ) -> None:
        self.script: Script = (lambda request: script) if isinstance(script, str) else script
        # Each answer waits this long first (and always yields to the loop, as an engine does:
        # requests sent together are in flight together).
        self.delay_s = delay_s
        self._model = model
        self.capabilities = Capabilities(token_ids=True, logprobs=True)
        self.calls: list[ScriptedCall] = []
        self.started = False

    @property
    def model(self) -> str:
        return self._model

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False

    async def complete(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> Completion:
        answer = self._answer(request, adapter, checkpoint)
        await asyncio.sleep(self.delay_s)
        factory = ChunkFactory(self._model)
        message = {"role": "assistant", "content": answer.text or None, **answer.tool_part}
        response = factory.completion(message, answer.finish, answer.usage, answer.logprobs)
        return self._completion(response, answer)

    async def stream(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        answer = self._answer(request, adapter, checkpoint)
        await asyncio.sleep(self.delay_s)
        factory = ChunkFactory(self._model)
        yield factory.chunk({"role": "assistant", "content": ""})
        for token in answer.tokens:
            yield factory.chunk({"content": token}, logprobs=_logprobs([token], request))
        if answer.tool_part:
            calls = [{**call, "index": i} for i, call in enumerate(answer.tool_part["tool_calls"])]
            yield factory.chunk({"tool_calls": calls})
        yield factory.chunk({}, answer.finish)
        options = request.stream_options or {}
        if options.get("include_usage"):
            yield factory.usage_chunk(answer.usage)
        message = {"role": "assistant", "content": answer.text or None, **answer.tool_part}
        response = factory.completion(message, answer.finish, answer.usage, answer.logprobs)
        yield self._completion(response, answer)

    def _answer(
        self, request: ChatRequest, adapter: Path | None, checkpoint: Path | None
    ) -> _Answer:
        self.calls.append(ScriptedCall(request, adapter, checkpoint))
        said = self.script(request)
        message = {"content": said} if isinstance(said, str) else said
        return _Answer.of(request, str(message.get("content") or ""), message.get("tool_calls"))

    def _completion(self, response: dict[str, Any], answer: _Answer) -> Completion:
        return Completion(
            response=response,
            model=self._model,
            token_ids=answer.token_ids,
            token_logprobs=[TOKEN_LOGPROB] * len(answer.token_ids),
            ttft_ms=1.0,
            prompt_token_ids=list(range(answer.usage["prompt_tokens"])),
        )


@dataclass(frozen=True)
class _Answer:
    tokens: list[str]
    finish: str
    tool_part: dict[str, Any]
    usage: dict[str, int]
    logprobs: dict[str, Any] | None

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [1000 + index for index in range(len(self.tokens))]

    @classmethod
    def of(cls, request: ChatRequest, text: str, tool_calls: Any) -> _Answer:
        finish = "tool_calls" if tool_calls else "stop"
        for stop in _stops(request):
            if stop in text:
                text, finish = text[: text.index(stop)], "stop"
        tokens = words(text)
        limit = request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS
        if len(tokens) > limit:
            tokens, finish = tokens[:limit], "length"
        prompt = sum(len(words(message_text(m.content))) for m in request.messages)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(tokens),
            "total_tokens": prompt + len(tokens),
        }
        tool_part = {"tool_calls": tool_calls} if tool_calls else {}
        return cls(tokens, finish, tool_part, usage, _logprobs(tokens, request))


def words(text: str) -> list[str]:
    """The scripted engine's tokens: each word with the spaces before it."""
    return re.findall(r"\s*\S+|\s+$", text)


def _stops(request: ChatRequest) -> list[str]:
    if request.stop is None:
        return []
    return [request.stop] if isinstance(request.stop, str) else list(request.stop)


def _logprobs(tokens: list[str], request: ChatRequest) -> dict[str, Any] | None:
    if not request.logprobs:
        return None
    top = request.top_logprobs or 0
    content = [
        {
            "token": token,
            "logprob": TOKEN_LOGPROB,
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": token, "logprob": TOKEN_LOGPROB, "bytes": list(token.encode())}
            ][:top],
        }
        for token in tokens
    ]
    return {"content": content}
