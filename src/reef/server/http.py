"""Small HTTP helpers shared by the routes: bounded JSON bodies, validation, SSE framing."""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from reef.errors import BadRequest, PayloadTooLarge, describe_validation_error

M = TypeVar("M", bound=BaseModel)

# Deeper than any real request (a tool's JSON schema included), shallow enough for every parser.
MAX_JSON_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# json.loads joins escaped pairs into one character, so a surrogate left in a string is alone.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
# orjson reads an integer past 64 bits as a float: such a value sends the body down the exact path.
_BIG_NUMBER = float(2**63)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, refusing bodies over `limit` bytes before reading them."""
    return (await read_json_bytes(request, limit))[0]


async def read_json_bytes(request: Request, limit: int) -> tuple[dict[str, Any], bytes]:
    """`read_json`, and the body's bytes as they came (to store, hash or forward unchanged)."""
    body = await read_bounded(request, limit)
    if not body:
        raise BadRequest("the request body is empty: send a JSON object")
    return json_object(body), body


async def read_optional_json(request: Request, limit: int) -> dict[str, Any]:
    """Like `read_json`, but an empty body is an empty object (routes whose body is optional)."""
    body = await read_bounded(request, limit)
    return json_object(body) if body else {}


async def read_bounded(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to be over `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large(limit)
        except ValueError:
            raise BadRequest("the Content-Length header is not a number") from None
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def json_object(body: bytes) -> dict[str, Any]:
    """Strict JSON: UTF-8, nested at most MAX_JSON_DEPTH deep, no NaN, valid Unicode, an object.

    orjson reads a body that is all of that about twenty times faster than the standard library;
    whatever it refuses or might have read inexactly goes the exact way, which names the problem.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _exact_object(body)
    if type(data) is dict and _plain(data):
        return data
    return _exact_object(body)


def _plain(value: dict[str, Any]) -> bool:
    """No container nested deeper than MAX_JSON_DEPTH and no float that may be an integer orjson
    rounded (it reads integers past 64 bits as floats); level by level, no recursion."""
    level: list[Any] = [value]
    for _ in range(MAX_JSON_DEPTH):
        deeper: list[Any] = []
        for container in level:
            for item in container.values() if type(container) is dict else container:
                kind = type(item)
                if kind is dict or kind is list:
                    deeper.append(item)
                elif kind is float and abs(item) >= _BIG_NUMBER:
                    return False
        if not deeper:
            return True
        level = deeper
    return False


def _exact_object(body: bytes) -> dict[str, Any]:
    """The standard library's reading, with every check that explains a refusal."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRequest(
            f"the request body is not valid UTF-8 (byte {error.start}): send JSON encoded as UTF-8"
        ) from None
    _check_depth(text)
    try:
        data = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_integer
        )
    except ValueError as error:
        raise BadRequest(f"the request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(data).__name__}")
    _check_unicode(text, data)
    return data


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"the request body holds {name}, which is not JSON: send finite numbers only")


def _finite(literal: str) -> float:
    """A float literal; one too large for a double (1e400) would become infinity, which no JSON
    answer can carry back."""
    value = float(literal)
    if not math.isfinite(value):
        raise BadRequest(f"the number {literal[:40]} is too large: send finite numbers only")
    return value


def _integer(literal: str) -> int:
    try:
        return int(literal)
    except ValueError:  # longer than Python converts (sys.int_info.default_max_str_digits)
        raise BadRequest(
            f"an integer of {len(literal)} digits is too large for any field: send a smaller one"
        ) from None


def _check_depth(text: str) -> None:
    """Refuse absurd nesting before parsing it: the parser (and storing) would recurse that deep.

    Strings are cut out first (a bracket inside a string is text), by a regex rather than a loop
    over characters, which would take seconds on a body of many megabytes.
    """
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for bracket in _BRACKETS.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(
                f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} deep: "
                "flatten it"
            )


def _check_unicode(text: str, data: dict[str, Any]) -> None:
    """Refuse lone UTF-16 surrogates (`\\ud800` without its pair): nothing can store them."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    where = _lone_surrogate_at(data, "")
    if where is not None:
        raise BadRequest(
            f"{where or 'body'}: a string holds a lone UTF-16 surrogate escape (\\ud800 to "
            "\\udfff without its pair), which is not Unicode text: send the pair or drop it"
        )


def _lone_surrogate_at(value: Any, path: str) -> str | None:
    """The dotted path of the first string (or key) with a lone surrogate, as pydantic names it."""
    if isinstance(value, str):
        return path if _LONE_SURROGATE.search(value) else None
    if not isinstance(value, dict | list):
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(key, str) and _LONE_SURROGATE.search(key):
            return f"{path or 'body'} (one of its keys)"  # the key itself cannot be shown
        found = _lone_surrogate_at(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def too_large(limit: int) -> PayloadTooLarge:
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
