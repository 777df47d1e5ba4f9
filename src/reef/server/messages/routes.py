"""`POST /v1/messages`: the Anthropic Messages API on the same engines, queue and store as chat.

The request is validated (`MessagesRequest`), translated into a chat request, rewritten by the
scenario's release like any chat request, and served; the answer is the chat completion read
back as an Anthropic message (or Anthropic's stream events). The record stores the translated
chat request and the chat completion, so recipes see one kind of trajectory. The receipt is the
`x-reef-agent-record-id` header on a whole response, and a `ping` event carrying
`{"reef": {"agent_record_id": ...}}` before `message_delta` on a stream. Errors, the request's
own included, answer in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.

`POST /v1/messages/count_tokens` counts the prompt the served model would read for such a request
(translated, under the scenario's release, through the model's chat template) with the engine's
own tokenizer; an engine without one (an upstream, vLLM) answers 501 rather than a guess. It is
not experience: nothing is recorded.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.errors import ReefError
from reef.protocol import ChatRequest
from reef.server.http import parse, read_json
from reef.server.messages.translate import (
    CountTokensRequest,
    MessagesRequest,
    MessageStreamShape,
    anthropic_message,
    error_of,
)
from reef.server.serving import answering_errors_as, served_whole, streamed
from reef.server.state import ServerState

log = logging.getLogger("reef.server")


@answering_errors_as(error_of)
async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    asked = parse(MessagesRequest, await read_json(request, state.config.server.max_body_bytes))
    body = asked.as_chat()
    call = state.call_context(request.headers)
    chat = call.served(parse(ChatRequest, body))
    if chat.stream:
        # message_start says the prompt's tokens, as Anthropic's does: counted here, where the
        # engine can (0 where it cannot: an upstream, vLLM).
        counted = 0
        if isinstance(state.engine, CountsTokens):
            counted = await run_in_threadpool(state.engine.count_prompt_tokens, chat)
        return await streamed(state, call, body, chat, MessageStreamShape(counted))
    completion, headers = await served_whole(request, state, call, body, chat)
    return JSONResponse(anthropic_message(completion.response), headers=headers)


@runtime_checkable
class CountsTokens(Protocol):
    """An engine that tokenizes prompts itself (llama.cpp)."""

    def count_prompt_tokens(self, request: ChatRequest) -> int: ...


@answering_errors_as(error_of)
async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    raw = await read_json(request, state.config.server.max_body_bytes)
    parse(CountTokensRequest, raw)  # what count_tokens takes, and nothing else
    asked = parse(MessagesRequest, {**raw, "max_tokens": 1})
    chat = state.call_context(request.headers).served(parse(ChatRequest, asked.as_chat()))
    engine = state.engine
    if not isinstance(engine, CountsTokens):
        raise ReefError(
            f"the {engine.name} engine has no tokenizer in Reef, so it cannot count tokens: "
            "read usage.input_tokens of a /v1/messages answer, or count with the upstream's "
            "own API",
            status=501,
            code="not_implemented_by_engine",
        )
    tokens = await run_in_threadpool(engine.count_prompt_tokens, chat)
    return JSONResponse({"input_tokens": tokens})


routes = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
