"""Small HTTP helpers shared by the routes: bounded JSON bodies, validation, SSE framing."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from reef.errors import BadRequest, PayloadTooLarge, describe_validation_error

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, refusing bodies over `limit` bytes before reading them."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _too_large(limit)
        except ValueError:
            raise BadRequest("the Content-Length header is not a number") from None
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > limit:
            raise _too_large(limit)
    if not body:
        raise BadRequest("the request body is empty: send a JSON object")
    try:
        data = json.loads(body)
    except ValueError as error:
        raise BadRequest(f"the request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is larger than {limit} bytes; send less, or raise server.max_body_bytes"
    )


def parse(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise BadRequest(describe_validation_error(error)) from None


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name} must be between {low} and {high}, got {value}")
    return value
