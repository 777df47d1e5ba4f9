"""The embeddings room: `POST /v1/embeddings`, on the engine's model (llama.cpp) or forwarded
upstream. Embeddings are not experience: they are served and never recorded.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.engines.base import Embeds, ForwardsJson
from reef.errors import ReefError
from reef.server.cancellation import until_disconnected
from reef.server.http import parse, read_json
from reef.server.state import ServerState

MAX_EMBEDDING_INPUTS = 256


class NotImplementedByEngine(ReefError):
    status = 501
    type = "invalid_request_error"
    code = "not_implemented_by_engine"


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the vector as little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    # A text, texts, token ids (one input), or lists of token ids, as OpenAI's `input`.
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str | None = None

    @field_validator("input")
    @classmethod
    def _texts(cls, value: Any) -> Any:
        if isinstance(value, list) and not 1 <= len(value) <= MAX_EMBEDDING_INPUTS:
            raise ValueError(f"send 1 to {MAX_EMBEDDING_INPUTS} inputs")
        return value

    @field_validator("encoding_format")
    @classmethod
    def _float_only(cls, value: str | None) -> str | None:
        if value not in (None, "float", "base64"):
            raise ValueError("encoding_format must be 'float' or 'base64'")
        return value

    def texts(self) -> list[str | list[int]]:
        """Each input: a text, or a list of token ids."""
        found = self.input
        if isinstance(found, str) or (found and isinstance(found[0], int)):
            return [found]
        return list(found)  # type: ignore[arg-type]


async def embeddings(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = await read_json(request, state.config.server.max_body_bytes)
    asked = parse(EmbeddingRequest, body)
    engine = state.engine
    if isinstance(engine, ForwardsJson):
        forwarded = engine.forward_json("/embeddings", body)
        return JSONResponse(await until_disconnected(request, forwarded))
    if not isinstance(engine, Embeds):
        raise NotImplementedByEngine(
            f"the {state.engine.name} engine cannot embed: serve with the llamacpp or an "
            "upstream engine for /v1/embeddings"
        )
    vectors, tokens = await until_disconnected(request, engine.embed(asked.texts()))
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


routes = [Route("/v1/embeddings", embeddings, methods=["POST"])]
