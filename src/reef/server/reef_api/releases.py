"""Release routes: scenarios, their releases and candidates; approve, reject, roll back (admin)."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.errors import NotFound
from reef.releases.chain import CURRENT_HEAD
from reef.releases.shadowing import start_shadow
from reef.scenario import SCENARIO_NAME, scenario_named
from reef.server.http import parse, read_json, read_optional_json
from reef.server.state import ServerState


class ApproveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, max_length=2000)
    # Release a candidate the gate scored worse than what serves (refused without it).
    force: bool = False


class CanaryBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    share: int | None = Field(None, ge=1, le=99)  # none: the scenario's gate.canary.share
    reason: str | None = Field(None, max_length=2000)
    # Put on a canary a candidate the gate scored worse, or never evaluated (refused without).
    force: bool = False


class RejectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=2000)


class ExpectedHead(BaseModel):
    """A body that may name the head the caller saw (null: no release yet): a head that moved
    since is a 409. Left out, whatever the head is now."""

    model_config = ConfigDict(extra="forbid")
    expected_head: str | None = None

    def expected(self) -> str | None:
        return self.expected_head if "expected_head" in self.model_fields_set else CURRENT_HEAD


class RollbackBody(ExpectedHead):
    to: str | None = None
    reason: str | None = None


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.reef
    return state


def _scenario(request: Request) -> str:
    """The scenario in the path; an `x-reef-scenario` header, if sent, must name the same."""
    scenario = str(request.path_params["scenario"])
    if not SCENARIO_NAME.fullmatch(scenario):
        raise NotFound(f"no scenario {scenario!r}")
    return scenario_named(request.headers, scenario, "the path")


async def list_scenarios(request: Request) -> Response:
    state = _state(request)

    def collect() -> list[dict[str, Any]]:
        counts = state.store.stats()["scenarios"]
        names = sorted(set(counts) | set(state.workflow.chain.scenarios()))
        result = []
        for name in names:
            head = state.workflow.chain.head(name)
            held = state.workflow.candidates.list(scenario=name, state="held")
            result.append(
                {
                    "scenario": name,
                    "head": head.to_json() if head else None,
                    "serving": state.bindings[name].release_id
                    if name in state.bindings
                    else "base",
                    "records": counts.get(name, {}).get("records", 0),
                    "held_candidates": len(held),
                }
            )
        return result

    return JSONResponse({"object": "list", "data": await run_in_threadpool(collect)})


async def list_releases(request: Request) -> Response:
    chain = _state(request).workflow.chain
    releases = await run_in_threadpool(chain.releases, _scenario(request))
    return JSONResponse({"object": "list", "data": [r.to_json() for r in releases]})


async def list_candidates(request: Request) -> Response:
    store = _state(request).workflow.candidates
    state_filter = request.query_params.get("state")
    found = await run_in_threadpool(store.list, _scenario(request), state_filter)
    return JSONResponse({"object": "list", "data": [c.to_json() for c in found]})


async def approve(request: Request) -> Response:
    state, scenario = _state(request), _scenario(request)
    limit = state.config.server.max_body_bytes
    body = parse(ApproveBody, await read_optional_json(request, limit))
    candidate_id = request.path_params["candidate_id"]
    await run_in_threadpool(_same_scenario, state, candidate_id, scenario)
    candidate = await run_in_threadpool(
        state.workflow.approve, candidate_id, body.reason, body.force
    )
    return JSONResponse(candidate.to_json())


async def canary(request: Request) -> Response:
    state, scenario = _state(request), _scenario(request)
    limit = state.config.server.max_body_bytes
    body = parse(CanaryBody, await read_optional_json(request, limit))
    candidate_id = request.path_params["candidate_id"]
    await run_in_threadpool(_same_scenario, state, candidate_id, scenario)
    share = body.share or state.config.gate_for(scenario).canary.share
    candidate = await run_in_threadpool(
        state.workflow.canary, candidate_id, share, body.reason, body.force
    )
    return JSONResponse(candidate.to_json())


async def shadow(request: Request) -> Response:
    state, scenario = _state(request), _scenario(request)
    candidate_id = request.path_params["candidate_id"]
    await run_in_threadpool(_same_scenario, state, candidate_id, scenario)
    candidate = await run_in_threadpool(start_shadow, state.workflow.candidates, candidate_id)
    return JSONResponse(candidate.to_json())


async def reject(request: Request) -> Response:
    state, scenario = _state(request), _scenario(request)
    body = parse(RejectBody, await read_json(request, state.config.server.max_body_bytes))
    candidate_id = request.path_params["candidate_id"]
    await run_in_threadpool(_same_scenario, state, candidate_id, scenario)
    candidate = await run_in_threadpool(state.workflow.reject, candidate_id, body.reason)
    return JSONResponse(candidate.to_json())


async def rollback(request: Request) -> Response:
    state, scenario = _state(request), _scenario(request)
    limit = state.config.server.max_body_bytes
    body = parse(RollbackBody, await read_optional_json(request, limit))
    release = await run_in_threadpool(
        functools.partial(
            state.workflow.chain.rollback,
            scenario,
            body.to,
            body.reason,
            expected_head=body.expected(),
        )
    )
    return JSONResponse(release.to_json(), status_code=201)


def _same_scenario(state: ServerState, candidate_id: str, scenario: str) -> None:
    """Refuse a candidate of another scenario (blocking: reads the store)."""
    if state.workflow.candidates.get(candidate_id).scenario != scenario:
        raise NotFound(f"candidate {candidate_id} is not in scenario {scenario!r}")


routes = [
    Route("/reef/scenarios", list_scenarios, methods=["GET"]),
    Route("/reef/scenarios/{scenario}/releases", list_releases, methods=["GET"]),
    Route("/reef/scenarios/{scenario}/candidates", list_candidates, methods=["GET"]),
    Route(
        "/reef/scenarios/{scenario}/candidates/{candidate_id}/approve", approve, methods=["POST"]
    ),
    Route("/reef/scenarios/{scenario}/candidates/{candidate_id}/reject", reject, methods=["POST"]),
    Route("/reef/scenarios/{scenario}/candidates/{candidate_id}/canary", canary, methods=["POST"]),
    Route("/reef/scenarios/{scenario}/candidates/{candidate_id}/shadow", shadow, methods=["POST"]),
    Route("/reef/scenarios/{scenario}/rollback", rollback, methods=["POST"]),
]
