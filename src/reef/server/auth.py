"""Bearer-token authentication as ASGI middleware, compared in constant time."""

from __future__ import annotations

import hmac
import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from reef.errors import Unauthorized

OPEN_PATHS = frozenset({"/healthz"})


def token_matches(provided: str, tokens: list[str]) -> bool:
    """True when `provided` equals one of `tokens`; every token is compared, whatever matches."""
    offered = provided.encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(offered, token.encode())
    return matched


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Requires `Authorization: Bearer <token>` on every path but /healthz, when tokens are set."""

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, provided = header.partition(" ")
        if scheme.lower() == "bearer" and provided and token_matches(provided.strip(), self.tokens):
            await self.app(scope, receive, send)
            return
        message = (
            "invalid bearer token: send the value of REEF_TOKEN"
            if provided
            else "missing bearer token: send `Authorization: Bearer $REEF_TOKEN`"
        )
        body = json.dumps(Unauthorized(message).to_json()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
