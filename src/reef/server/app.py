"""The ASGI application: every room's routes, authentication, and errors in OpenAI's JSON shape.

The API rooms (chat, completions, embeddings, responses, messages) and Reef's own API
(`reef_api`: records and feedback, releases, review, harness installs, the internal route) each
export their `routes`; this module only puts them together with the middleware.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from reef.episodes.budget import EpisodeBudgets
from reef.errors import ReefError
from reef.server import chat, completions, embeddings, messages, responses
from reef.server.auth import BearerAuth
from reef.server.browser import browser_middleware
from reef.server.in_flight import CountInFlight
from reef.server.metrics import CountRequests
from reef.server.reef_api import (
    harness,
    imports,
    internal,
    metrics,
    proposals,
    records,
    releases,
    review,
    scenarios,
)
from reef.server.start_release import BindStartRelease
from reef.server.state import ServerState
from reef.server.tracing import TraceRequests

log = logging.getLogger("reef.server")


async def _reef_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ReefError)
    if error.status >= 500:
        log.warning(
            "%s %s -> %s: %s", request.method, request.url.path, error.status, error.message
        )
    return JSONResponse(error.to_json(), status_code=error.status, headers=error.headers)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = {
        404: f"no route {request.method} {request.url.path}: see docs/http-api.md",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "code": str(error.status_code),
        }
    }
    return JSONResponse(body, status_code=error.status_code)


async def _unexpected(request: Request, error: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = {
        "error": {
            "message": f"internal error ({type(error).__name__}); see the server log",
            "type": "server_error",
            "code": "internal_error",
        }
    }
    return JSONResponse(body, status_code=500)


def create_app(state: ServerState) -> Starlette:
    """The app for an engine and a store that the caller owns: it starts and closes them."""
    routes: list[BaseRoute] = [
        *records.routes,
        *imports.routes,
        *scenarios.routes,
        *chat.routes,
        *completions.routes,
        *embeddings.routes,
        *messages.routes,
        *responses.routes,
        *releases.routes,
        *review.routes,
        *harness.routes,
        *proposals.routes,
        *internal.routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            # Each request in a span of its own, when tracing is on (`otel`).
            Middleware(TraceRequests, tracing=state.tracing),
            Middleware(CountInFlight, in_flight=state.in_flight),
            # Every request by route and status (refusals too), for GET /metrics.
            Middleware(CountRequests, metrics=state.metrics, routes=routes),
            # Then a page in the user's browser is refused before anything else runs.
            *browser_middleware(state.config.server),
            # GET /metrics, which takes server.metrics_token besides the other tokens.
            Middleware(metrics.MetricsRoute, state=state),
            Middleware(
                BearerAuth,
                tokens=state.config.token_values(),
                admin_tokens=state.config.admin_token_values(),
                internal_tokens=[state.internal_token],
                budgets=EpisodeBudgets(
                    state.config.episodes.token_calls, state.config.episodes.token_bytes
                ),
                max_body_bytes=state.config.server.max_body_bytes,
            ),
            # A call's x-reef-release-id (upstream's): a new scenario starts from that release.
            Middleware(BindStartRelease, state=state),
        ],
        exception_handlers={
            ReefError: _reef_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.state.reef = state
    return app
