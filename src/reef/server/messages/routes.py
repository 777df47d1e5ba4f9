"""`POST /v1/messages`: the Anthropic Messages API on the same engines, queue and store as chat.

The request is validated (`MessagesRequest`), translated into a chat request, rewritten by the
scenario's release like any chat request, and served; the answer is the chat completion read
back as an Anthropic message (or Anthropic's stream events). The record stores the translated
chat request and the chat completion, so recipes see one kind of trajectory. The receipt is the
`x-reef-agent-record-id` header on a whole response, and a `ping` event carrying
`{"reef": {"agent_record_id": ...}}` before `message_delta` on a stream. Errors, the request's
own included, answer in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.protocol import ChatRequest
from reef.server.http import parse, read_json
from reef.server.messages.translate import (
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
        return await streamed(state, call, body, chat, MessageStreamShape())
    completion, headers = await served_whole(request, state, call, body, chat)
    return JSONResponse(anthropic_message(completion.response), headers=headers)


routes = [Route("/v1/messages", messages, methods=["POST"])]
