"""The chat completions room: `POST /v1/chat/completions` (whole or streamed) and
`GET /v1/models`.

A request no harness changed reaches an engine that forwards JSON as the client's bytes.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.protocol import ChatRequest
from reef.server.http import parse, read_json_bytes
from reef.server.serving import answered, served_whole, streamed
from reef.server.state import ServerState


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body, raw = await read_json_bytes(request, state.config.server.max_body_bytes)
    call = state.call_context(request.headers)
    asked = parse(ChatRequest, body)
    chat = call.served(asked)
    if chat is asked and _as_sent(asked, body):  # nothing changed it: send the client's bytes
        chat.sent_as(raw)
    if chat.stream:
        return await streamed(state, call, body, chat, raw_body=raw)
    completion, headers = await served_whole(request, state, call, body, chat, raw_body=raw)
    return answered(completion, headers)


def _as_sent(asked: ChatRequest, body: dict[str, Any]) -> bool:
    """Whether validation kept every top-level value as the client wrote it: a lax coercion
    (`"max_tokens": "5"` read as 5, `"stream": 1` as true) must reach the upstream as coerced."""
    for name in asked.model_fields_set:
        kept, sent = type(getattr(asked, name)), type(body.get(name))
        same = sent is kept or (kept is float and sent is int)  # 1 for 1.0 is the same JSON
        if kept in (bool, int, float, str) and not same:
            return False
    return True


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    model = {
        "id": state.engine.model,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "reef",
    }
    return JSONResponse({"object": "list", "data": [model]})


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
