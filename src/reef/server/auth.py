"""Token authentication as ASGI middleware, compared in constant time.

The token comes as `Authorization: Bearer TOKEN`, or (as Anthropic's clients send it) as
`x-api-key: TOKEN`; a bearer header, when sent, is the one read.

An episode's token (`reef-ep.…`, reef.episodes.tokens) serves inference in its scenario only,
until the episode's deadline; the call is put in the episode's session and tagged with the
episode, task and tree, whatever the agent sent.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import urllib.parse
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.episodes.budget import EpisodeBudgets, EpisodeBudgetSpent
from reef.episodes.tokens import (
    BadEpisodeToken,
    EpisodeGrant,
    is_episode_token,
    trial_of,
    verify,
)
from reef.errors import Forbidden, ReefError, Unauthorized
from reef.server.http import too_large

OPEN_PATHS = frozenset({"/healthz"})
# Routes of Anthropic's API: their refusals are in Anthropic's error shape.
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
ADMIN_PREFIX = "/reef/scenarios/"
INTERNAL_PREFIX = "/reef/internal/"
# What an episode's token may call: inference, and the model list agents ask for first.
INFERENCE_PATHS = frozenset(
    {
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
    }
)
# The tree an episode's grant names: set from a verified grant only, dropped from any call.
TREE_HEADER = b"x-reef-episode-tree"
# Headers an episode's calls cannot set themselves: the token's grant sets them.
GRANT_HEADERS = (b"x-reef-scenario", b"x-reef-session", b"x-reef-capture", TREE_HEADER)


# Where the middleware says whether the caller holds the admin token (or no token is configured),
# for a route that needs it only for some bodies (`POST /reef/scenarios` with a release).
ADMIN_STATE = "reef_admin"


def needs_admin(method: str, path: str) -> bool:
    """Changing what a scenario serves (approve, reject, roll back) takes the admin token."""
    return method == "POST" and path.startswith(ADMIN_PREFIX)


def caller_is_admin(scope: Scope) -> bool:
    """Whether this request's caller may change what a scenario serves."""
    return bool(scope.get("state", {}).get(ADMIN_STATE, False))


def _as(scope: Scope, admin: bool) -> Scope:
    return {**scope, "state": {**scope.get("state", {}), ADMIN_STATE: admin}}


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
        budgets: EpisodeBudgets | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.admin_tokens = admin_tokens
        self.internal_tokens = internal_tokens or []
        self.budgets = budgets  # what each episode's token may still send (none: no budget)
        self.max_body_bytes = max_body_bytes  # the most of an episode's body held to count it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and any(name == TREE_HEADER for name, _ in scope["headers"]):
            # Only a verified episode grant says which tree serves a call (`_episode`).
            kept = [(name, value) for name, value in scope["headers"] if name != TREE_HEADER]
            scope = {**scope, "headers": kept}
        if scope["type"] == "http" and scope["path"].startswith(INTERNAL_PREFIX):
            await self._internal(scope, receive, send)
            return
        if scope["type"] == "http" and is_episode_token(provided_token(scope)):
            await self._episode(scope, receive, send)
            return
        open_route = scope["type"] != "http" or scope["path"] in OPEN_PATHS
        if open_route or not (self.tokens or self.admin_tokens):
            unguarded = not (self.tokens or self.admin_tokens)  # loopback, every route open
            if scope["type"] == "http":
                scope = _as(scope, unguarded)
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
            await refuse(send, Unauthorized(message), scope)
        elif needs_admin(scope["method"], scope["path"]) and not admin:
            await refuse(
                send,
                Forbidden(
                    "this route changes what a scenario serves and needs an admin token: "
                    "send the value of REEF_ADMIN_TOKEN"
                ),
                scope,
            )
        else:
            await self.app(_as(scope, admin), receive, send)

    async def _internal(self, scope: Scope, receive: Receive, send: Send) -> None:
        provided = _bearer(scope)
        if provided and token_matches(provided, [*self.internal_tokens, *self.admin_tokens]):
            await self.app(scope, receive, send)
            return
        await refuse(
            send,
            Forbidden(
                "internal routes serve Reef's own processes: send the internal token from "
                ".reef/server.json (or an admin token)",
                code="internal_token_required",
            ),
            scope,
        )

    async def _episode(self, scope: Scope, receive: Receive, send: Send) -> None:
        signers = [*self.tokens, *self.admin_tokens, *self.internal_tokens]
        try:
            grant = verify(provided_token(scope), signers)
        except BadEpisodeToken as error:
            await refuse(
                send, Unauthorized(f"{error}: ask the episode runner for a new one"), scope
            )
            return
        if scope["path"] not in INFERENCE_PATHS:
            message = f"an episode's token serves inference only, not {scope['path']}"
            await refuse(send, Forbidden(message, code="episode_token_scope"), scope)
            return
        sent = dict(scope["headers"]).get(b"x-reef-scenario", b"").decode("latin-1")
        if sent and sent != grant.scenario:
            message = (
                f"this episode's token serves scenario {grant.scenario!r}, not {sent!r}: "
                "drop x-reef-scenario or send the episode's"
            )
            await refuse(send, Forbidden(message, code="episode_token_scope"), scope)
            return
        if self.budgets is not None:
            try:
                left = self.budgets.take_call(grant)
            except EpisodeBudgetSpent as error:
                await refuse(send, error, scope)
                return
            body = await _body_within(receive, min(left, self.max_body_bytes))
            if body is None:
                over = left <= self.max_body_bytes  # the budget ran out before the body did
                await refuse(
                    send,
                    self.budgets.spent_bytes(grant) if over else too_large(self.max_body_bytes),
                    scope,
                )
                return
            self.budgets.add_bytes(grant, len(body))
            receive = _replaying(body, receive)
        await self.app(
            {**scope, "headers": granted_headers(scope["headers"], grant)}, receive, send
        )


async def _body_within(receive: Receive, most: int) -> bytes | None:
    """The request's body, read whole, or None once it passes `most` bytes (the rest unread)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client left: the app will see its request end
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > most:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` whole first, then what the client sends (its leaving)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def granted_headers(headers: list[tuple[bytes, bytes]], grant: EpisodeGrant) -> list[Any]:
    """The call's headers with the grant's scenario, session and tags in place of any the
    agent sent, so every call of the episode is recorded in its session, tagged. An episode
    under a trial tree (a recipe's search scoring a tree it tries) is not recorded: like the
    answers a search scores, it is not experience."""
    kept = [
        (name, value)
        for name, value in headers
        if name not in GRANT_HEADERS and not name.startswith(b"x-reef-tag-")
    ]
    given = {
        b"x-reef-scenario": grant.scenario,
        b"x-reef-session": grant.episode,
        b"x-reef-tag-episode": grant.episode,
        b"x-reef-tag-task": grant.task,
        b"x-reef-tag-tree": grant.tree,
        TREE_HEADER: grant.tree,
    }
    if trial_of(grant.tree) is not None:
        given[b"x-reef-capture"] = "false"
    return kept + [(name, header_value(value)) for name, value in given.items()]


def header_value(value: str) -> bytes:
    """A header's bytes: ASCII as it is, anything else percent-encoded as UTF-8 (a task folder
    named `tâche-任务` made every agent call a 500 when encoded as latin-1)."""
    if value.isascii():
        return value.encode("ascii")
    return urllib.parse.quote(value, safe=" !#$&'()*+,/:;=?@[]~").encode("ascii")


def _bearer(scope: Scope) -> str:
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, provided = header.partition(" ")
    return provided.strip() if scheme.lower() == "bearer" else ""


def _api_key(scope: Scope) -> str:
    return dict(scope["headers"]).get(b"x-api-key", b"").decode("latin-1").strip()


def provided_token(scope: Scope) -> str:
    """The token a request sends: a bearer header when there is one, else `x-api-key`."""
    return _bearer(scope) or _api_key(scope)


async def refuse(send: Send, error: ReefError, scope: Scope) -> None:
    """Answer `error` before the app runs, in the shape of the API the path belongs to."""
    headers = [(b"content-type", b"application/json")]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    body = error.to_json()
    if scope["path"] in ANTHROPIC_PATHS:
        body = {"type": "error", "error": {"type": error.type, "message": error.message}}
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
