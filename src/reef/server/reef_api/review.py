"""Routes for `reef review --url`: the reads its screens need, and promote (admin).

The reads take the inference token; promote sits under /reef/scenarios/ like the other
decisions, so it takes the admin token. They answer with the same dataclasses the local
review reads (reef.review.queries), as JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.review import queries
from reef.review.rows import to_json
from reef.scenario import scenario_named
from reef.server.auth import provided_token, token_matches
from reef.server.http import parse, query_int, read_json
from reef.server.reef_api.releases import ExpectedHead
from reef.server.state import ServerState


class PromoteBody(ExpectedHead):
    release_id: str
    reason: str | None = None


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.reef
    return state


def _serving(state: ServerState) -> dict[str, str]:
    return {name: binding.release_id for name, binding in state.bindings.items()}


async def _answer(work: Callable[[], Any], status: int = 200) -> Response:
    return JSONResponse(to_json(await run_in_threadpool(work)), status_code=status)


async def access(request: Request) -> Response:
    """Whether the caller's token may decide (approve, reject, roll back, promote)."""
    config = _state(request).config
    admins, anyone = config.admin_token_values(), config.token_values()
    provided = provided_token(request.scope)
    can_decide = not (admins or anyone) or (bool(provided) and token_matches(provided, admins))
    why = "" if can_decide else "this token is not an admin token: set REEF_ADMIN_TOKEN to decide"
    return JSONResponse({"can_decide": can_decide, "why": why})


async def overview(request: Request) -> Response:
    state = _state(request)
    return await _answer(lambda: queries.scenario_summaries(state.workflow, _serving(state)))


async def candidates(request: Request) -> Response:
    workflow = _state(request).workflow
    state_filter = request.query_params.get("state") or None
    scenario = request.query_params.get("scenario") or None
    limit = query_int(request, "limit", default=200, low=1, high=1000)
    return await _answer(lambda: queries.candidate_rows(workflow, state_filter, scenario, limit))


async def candidate(request: Request) -> Response:
    workflow, candidate_id = _state(request).workflow, request.path_params["candidate_id"]
    return await _answer(lambda: queries.candidate_detail(workflow, candidate_id))


async def releases(request: Request) -> Response:
    state = _state(request)
    scenario = request.query_params.get("scenario") or None
    limit = query_int(request, "limit", default=200, low=1, high=1000)
    serving = _serving(state)
    return await _answer(lambda: queries.release_rows(state.workflow, scenario, serving, limit))


async def release_diff(request: Request) -> Response:
    workflow, release_id = _state(request).workflow, request.path_params["release_id"]
    diff = await run_in_threadpool(queries.release_diff, workflow, release_id)
    return JSONResponse({"release_id": release_id, "diff": diff})


async def records(request: Request) -> Response:
    store = _state(request).store
    scenario = request.query_params.get("scenario") or None
    search = request.query_params.get("search", "")
    limit = query_int(request, "limit", default=200, low=1, high=1000)
    return await _answer(lambda: queries.record_rows(store, scenario, search, limit))


async def promote(request: Request) -> Response:
    """Publish a release of this scenario equal to `release_id`, if the head is still
    `expected_head` (when given)."""
    state = _state(request)
    scenario = scenario_named(request.headers, str(request.path_params["scenario"]), "the path")
    body = parse(PromoteBody, await read_json(request, state.config.server.max_body_bytes))
    chain = state.workflow.chain

    release = await run_in_threadpool(
        functools.partial(
            chain.promote, body.release_id, scenario, body.reason, expected_head=body.expected()
        )
    )
    return JSONResponse(release.to_json(), status_code=201)


routes = [
    Route("/reef/review/access", access, methods=["GET"]),
    Route("/reef/review/overview", overview, methods=["GET"]),
    Route("/reef/review/candidates", candidates, methods=["GET"]),
    Route("/reef/review/candidates/{candidate_id}", candidate, methods=["GET"]),
    Route("/reef/review/releases", releases, methods=["GET"]),
    Route("/reef/review/releases/{release_id}/diff", release_diff, methods=["GET"]),
    Route("/reef/review/records", records, methods=["GET"]),
    Route("/reef/scenarios/{scenario}/promote", promote, methods=["POST"]),
]
