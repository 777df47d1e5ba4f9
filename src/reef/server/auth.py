"""Token authentication as ASGI middleware, compared in constant time.

The token comes as `Authorization: Bearer TOKEN`, or (as Anthropic's clients send it) as
`x-api-key: TOKEN`; a bearer header, when sent, is the one read.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from reef.errors import Forbidden, ReefError, Unauthorized

OPEN_PATHS = frozenset({"/healthz"})
# Routes of Anthropic's API: their refusals are in Anthropic's error shape.
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
ADMIN_PREFIX = "/reef/scenarios/"
INTERNAL_PREFIX = "/reef/internal/"


def needs_admin(method: str, path: str) -> bool:
    """Changing what a scenario serves (approve, reject, roll back) takes the admin token."""
    return method == "POST" and path.startswith(ADMIN_PREFIX)


def token_matches(provided: str, tokens: list[str]) -> bool:
    """True when `provided` equals one of `tokens`; every token is compared, whatever matches."""
    offered = provided.encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(offered, token.encode())
    return matched


@functools.lru_cache(maxsize=256)  # asked on every request, of the few hosts clients send
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Bearer tokens on every path but /healthz, once any token is configured.

    An inference token serves and reports; an admin token does that and also approves, rejects
    and rolls back. Without any token (loopback only) every route is open, except the internal
    routes: they take the server's internal token (or an admin token), always.
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: list[str],
        admin_tokens: list[str],
        internal_tokens: list[str] | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.admin_tokens = admin_tokens
        self.internal_tokens = internal_tokens or []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(INTERNAL_PREFIX):
            await self._internal(scope, receive, send)
            return
        open_route = scope["type"] != "http" or scope["path"] in OPEN_PATHS
        if open_route or not (self.tokens or self.admin_tokens):
            await self.app(scope, receive, send)
            return
        provided = provided_token(scope)
        admin = bool(provided) and token_matches(provided, self.admin_tokens)
        user = admin or (bool(provided) and token_matches(provided, self.tokens))
        if not user:
            message = (
                "invalid token: send the value of REEF_TOKEN"
                if provided
                else "missing token: send `Authorization: Bearer $REEF_TOKEN` "
                "(or `x-api-key: $REEF_TOKEN`)"
            )
            await _refuse(send, Unauthorized(message), scope)
        elif needs_admin(scope["method"], scope["path"]) and not admin:
            await _refuse(
                send,
                Forbidden(
                    "this route changes what a scenario serves and needs an admin token: "
                    "send the value of REEF_ADMIN_TOKEN"
                ),
                scope,
            )
        else:
            await self.app(scope, receive, send)

    async def _internal(self, scope: Scope, receive: Receive, send: Send) -> None:
        provided = _bearer(scope)
        if provided and token_matches(provided, [*self.internal_tokens, *self.admin_tokens]):
            await self.app(scope, receive, send)
            return
        await _refuse(
            send,
            Forbidden(
                "internal routes serve Reef's own processes: send the internal token from "
                ".reef/server.json (or an admin token)",
                code="internal_token_required",
            ),
            scope,
        )


def _bearer(scope: Scope) -> str:
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, provided = header.partition(" ")
    return provided.strip() if scheme.lower() == "bearer" else ""


def _api_key(scope: Scope) -> str:
    return dict(scope["headers"]).get(b"x-api-key", b"").decode("latin-1").strip()


def provided_token(scope: Scope) -> str:
    """The token a request sends: a bearer header when there is one, else `x-api-key`."""
    return _bearer(scope) or _api_key(scope)


async def _refuse(send: Send, error: ReefError, scope: Scope) -> None:
    headers = [(b"content-type", b"application/json")]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    body = error.to_json()
    if scope["path"] in ANTHROPIC_PATHS:
        body = {"type": "error", "error": {"type": error.type, "message": error.message}}
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
