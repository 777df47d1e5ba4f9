"""`POST /v1/responses`: the OpenAI Responses API on the same engines, queue and store as chat.

The request is validated (`request.parsed`), chained onto the response it names as
`previous_response_id` (read back from that response's record), translated into a chat request,
rewritten by the scenario's release like any chat request, and served. The record stores the
translated chat request and the chat completion, so recipes see one kind of trajectory; its id
is the response's (`resp_X` is record `rec_X`). The receipt is the `x-reef-agent-record-id`
header on a whole response, and `"reef": {"agent_record_id": ...}` in a stream's last event.
Errors answer in the Responses shape, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.protocol import ChatRequest
from reef.server.call import CallContext
from reef.server.http import parse, read_json
from reef.server.responses.output import (
    ResponseStreamShape,
    record_id_of,
    response_id_of,
    whole_response,
)
from reef.server.responses.request import ResponsesError, error_body, history_of, parsed
from reef.server.serving import answering_errors_as, served_whole, streamed
from reef.server.state import ServerState
from reef.store.experience import new_id

log = logging.getLogger("reef.server")


@answering_errors_as(error_body)
async def responses(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    asked = parsed(await read_json(request, state.config.server.max_body_bytes))
    call = state.call_context(request.headers)
    history: list[dict[str, Any]] = []
    if asked.previous_response_id is not None:
        history, call = await _chained(state, call, asked.previous_response_id)
    body = asked.as_chat(history)
    chat = call.served(parse(ChatRequest, body))
    record_id = new_id("rec")
    response_id = response_id_of(record_id)
    recorded = asked.recorded(body)
    if chat.stream:
        shape = ResponseStreamShape(response_id, asked)
        return await streamed(state, call, recorded, chat, shape, record_id)
    completion, headers = await served_whole(request, state, call, recorded, chat, record_id)
    return JSONResponse(whole_response(response_id, asked, completion.response), headers=headers)


async def _chained(
    state: ServerState, call: CallContext, previous: str
) -> tuple[list[dict[str, Any]], CallContext]:
    """The conversation the previous response holds, and the call in its session (when the
    call names none): a chained call continues that conversation."""
    record_id = record_id_of(previous)
    record = await run_in_threadpool(state.store.get_record, record_id) if record_id else None
    if record is None or record["scenario"] != call.scenario:
        raise ResponsesError(
            f"previous_response_id {previous!r} names no stored response in scenario "
            f"{call.scenario!r}: send the id of an earlier response served (and recorded, "
            "without x-reef-capture: false) in this scenario, or send the whole conversation "
            "as input",
            status=404,
            code="previous_response_not_found",
            param="previous_response_id",
        )
    if call.session is None and record.get("session"):
        call = dataclasses.replace(call, session=record["session"])
    return history_of(record), call


routes = [Route("/v1/responses", responses, methods=["POST"])]
