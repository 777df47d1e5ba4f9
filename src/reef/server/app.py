"""The ASGI application: routes, authentication, and errors in OpenAI's JSON shape."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.errors import ReefError
from reef.server import (
    anthropic_routes,
    completion_routes,
    harness_routes,
    internal_routes,
    openai_routes,
    reef_routes,
    release_routes,
    responses_routes,
    review_routes,
)
from reef.server.auth import BearerAuth
from reef.server.browser import browser_middleware
from reef.server.in_flight import CountInFlight
from reef.server.state import ServerState

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
    routes = [
        Route("/healthz", reef_routes.healthz, methods=["GET"]),
        Route("/v1/models", openai_routes.list_models, methods=["GET"]),
        Route("/v1/chat/completions", openai_routes.chat_completions, methods=["POST"]),
        Route("/v1/completions", completion_routes.completions, methods=["POST"]),
        Route("/v1/embeddings", completion_routes.embeddings, methods=["POST"]),
        Route("/v1/messages", anthropic_routes.messages, methods=["POST"]),
        Route("/v1/responses", responses_routes.responses, methods=["POST"]),
        Route("/reef/report", reef_routes.report, methods=["POST"]),
        Route("/reef/records", reef_routes.list_records, methods=["GET"]),
        Route("/reef/records/{record_id}", reef_routes.get_record, methods=["GET"]),
        Route("/reef/status", reef_routes.status, methods=["GET"]),
        Route("/reef/train", reef_routes.train, methods=["POST"]),
        *release_routes.routes,
        *review_routes.routes,
        *harness_routes.routes,
        *internal_routes.routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(CountInFlight, in_flight=state.in_flight),
            # Then a page in the user's browser is refused before anything else runs.
            *browser_middleware(state.config.server),
            Middleware(
                BearerAuth,
                tokens=state.config.token_values(),
                admin_tokens=state.config.admin_token_values(),
                internal_tokens=[state.internal_token],
            ),
        ],
        exception_handlers={
            ReefError: _reef_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.state.reef = state
    return app
