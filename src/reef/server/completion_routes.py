"""`POST /v1/completions` (legacy text completions) and `POST /v1/embeddings`.

Text completions run on the engine like chat requests (same queue, same binding's settings and
LoRA, same record and receipt) with the prompt continued as it is. On an upstream or vLLM engine
both routes are forwarded to the same route of the upstream, whole (a streamed text completion
there is refused: stream chat completions instead). Embeddings are not experience: they are
served and never recorded.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reef.errors import ReefError, Unsupported
from reef.protocol import Completion
from reef.server.cancellation import until_disconnected
from reef.server.http import parse, read_json
from reef.server.openai_routes import stored, streamed, with_response
from reef.server.state import CallContext, ServerState
from reef.server.text_completions import TextCompletionRequest, TextStreamShape, text_completion

MAX_EMBEDDING_INPUTS = 256


class NotImplementedByEngine(ReefError):
    status = 501
    type = "invalid_request_error"
    code = "not_implemented_by_engine"


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = await read_json(request, state.config.server.max_body_bytes)
    call = state.call_context(request.headers)
    asked = parse(TextCompletionRequest, body)
    forward = getattr(state.engine, "forward_json", None)
    started = time.perf_counter()
    if forward is not None:
        if asked.stream:
            raise Unsupported(
                f"the {state.engine.name} engine forwards text completions whole: send "
                "stream false, or stream /v1/chat/completions"
            )
        answer = await until_disconnected(
            request, forward("/completions", body, call.binding.adapter)
        )
        return await _answer(state, call, body, answer, started)
    chat = call.served(asked.as_chat()).continuing(asked.text())
    if asked.stream:
        return await streamed(state, call, body, chat, TextStreamShape(asked.text(), asked.echo))
    completion = await until_disconnected(
        request, state.engine.complete(chat, adapter=call.binding.adapter)
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


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the vector as little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[str]
    encoding_format: str | None = None

    @field_validator("input")
    @classmethod
    def _texts(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not 1 <= len(value) <= MAX_EMBEDDING_INPUTS:
            raise ValueError(f"send 1 to {MAX_EMBEDDING_INPUTS} strings")
        return value

    @field_validator("encoding_format")
    @classmethod
    def _float_only(cls, value: str | None) -> str | None:
        if value not in (None, "float", "base64"):
            raise ValueError("encoding_format must be 'float' or 'base64'")
        return value

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


async def embeddings(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = await read_json(request, state.config.server.max_body_bytes)
    asked = parse(EmbeddingRequest, body)
    forward = getattr(state.engine, "forward_json", None)
    if forward is not None:
        return JSONResponse(await until_disconnected(request, forward("/embeddings", body)))
    embed = getattr(state.engine, "embed", None)
    if embed is None:
        raise NotImplementedByEngine(
            f"the {state.engine.name} engine cannot embed: serve with the llamacpp or an "
            "upstream engine for /v1/embeddings"
        )
    vectors, tokens = await until_disconnected(request, embed(asked.texts()))
    encode = _base64 if asked.encoding_format == "base64" else list
    data = [
        {"object": "embedding", "index": index, "embedding": encode(vector)}
        for index, vector in enumerate(vectors)
    ]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": state.engine.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
