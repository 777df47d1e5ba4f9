"""Errors that carry an HTTP status and a message telling the caller what to fix.

The server turns every `ReefError` into OpenAI's error shape:
`{"error": {"message": ..., "type": ..., "code": ...}}`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from reef.urls import without_password


class ReefError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}  # sent with the error response (e.g. Retry-After)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


class BadRequest(ReefError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unsupported(BadRequest):
    """A valid OpenAI request that the serving engine cannot honour."""

    code = "unsupported_by_engine"


class Unauthorized(ReefError):
    status = 401
    type = "authentication_error"
    code = "invalid_token"


class Forbidden(ReefError):
    status = 403
    type = "permission_error"
    code = "admin_token_required"


class NotFound(ReefError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class Conflict(ReefError):
    status = 409
    type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(ReefError):
    status = 413
    type = "invalid_request_error"
    code = "body_too_large"


class UpstreamFailure(ReefError):
    """The upstream engine failed; `status` is its own for HTTP errors, 502 when unreachable."""

    status = 502
    type = "upstream_error"
    code = "upstream_failure"


class EngineUnavailable(ReefError):
    status = 503
    type = "engine_unavailable"
    code = "engine_unavailable"


class Overloaded(ReefError):
    """The engine's queue is full: the caller should retry after `Retry-After` seconds."""

    status = 503
    type = "server_overloaded"
    code = "queue_full"


def describe_validation_error(
    error: Any, known: Callable[[tuple[Any, ...]], list[str]] | None = None
) -> str:
    """One line per problem in a pydantic ValidationError, each naming the field's path; an
    unknown key says which known one it may be (`known(path)`: the keys beside it)."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "body"
        if item["type"] == "extra_forbidden":
            near = _near(str(item["loc"][-1]), known(item["loc"][:-1]) if known else [])
            lines.append(f"{where}: unknown key" + (f" (did you mean {near}?)" if near else ""))
        elif item["type"] == "missing":
            lines.append(f"{where}: required")
        else:
            given = item.get("input")
            if isinstance(given, str) and "://" in given:  # a URL may carry a password
                given = without_password(given)
            got = repr(given)
            got = got if len(got) <= 80 else got[:77] + "..."
            lines.append(f"{where}: {item['msg']} (got {got})")
    return "; ".join(lines)


class ConfigurationRefused(ReefError):
    """The configuration is valid but unsafe or impossible to run as given."""

    status = 400
    type = "configuration_error"


def _near(key: str, keys: list[str]) -> str | None:
    """The known key `key` most likely misspells, or None."""
    found = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    return found[0] if found else None
