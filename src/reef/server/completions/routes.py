"""The text completions room: `POST /v1/completions` (legacy text completions).

Text completions run on the engine like chat requests (same queue, same binding's settings and
LoRA, same record and receipt) with the prompt continued as it is. On an upstream or vLLM engine
the route is forwarded to the same route of the upstream, whole (a streamed text completion
there is refused: stream chat completions instead).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.engines.base import ForwardsJson
from reef.errors import Unsupported
from reef.protocol import Completion
from reef.server.call import CallContext
from reef.server.cancellation import until_disconnected
from reef.server.completions.text import TextCompletionRequest, TextStreamShape, text_completion
from reef.server.http import parse, read_json
from reef.server.serving import stored, streamed, with_response
from reef.server.state import ServerState


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = await read_json(request, state.config.server.max_body_bytes)
    call = state.call_context(request.headers)
    asked = parse(TextCompletionRequest, body)
    started = time.perf_counter()
    if isinstance(state.engine, ForwardsJson):
        if asked.stream:
            raise Unsupported(
                f"the {state.engine.name} engine forwards text completions whole: send "
                "stream false, or stream /v1/chat/completions"
            )
        answer = await until_disconnected(
            request,
            state.engine.forward_json(
                "/completions", body, call.binding.adapter, call.binding.checkpoint
            ),
        )
        return await _answer(state, call, body, answer, started)
    chat = call.served(asked.as_chat()).continuing(asked.text())
    if asked.stream:
        return await streamed(state, call, body, chat, TextStreamShape(asked.text(), asked.echo))
    completion = await until_disconnected(
        request,
        state.engine.complete(
            chat, adapter=call.binding.adapter, checkpoint=call.binding.checkpoint
        ),
    )
    completion = with_response(
        completion, text_completion(completion.response, asked.text(), asked.echo)
    )
    headers = await stored(state, call, body, completion, started)
    return JSONResponse(completion.response, headers=headers)


async def _answer(
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    answer: dict[str, Any],
    started: float,
) -> Response:
    completion = Completion(response=answer, model=str(answer.get("model") or state.engine.model))
    return JSONResponse(answer, headers=await stored(state, call, body, completion, started))


routes = [Route("/v1/completions", completions, methods=["POST"])]
