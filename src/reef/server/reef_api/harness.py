"""Harness routes: a scenario's current harness, the adapters, and their install scripts."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from reef.config import AUTO_MAX_TOKENS
from reef.harness.installers import list_adapters, render_install
from reef.inference.binding import BASE_BINDING
from reef.scenario import DEFAULT_SCENARIO, check_scenario
from reef.server.state import ServerState


def _harness(state: ServerState, scenario: str) -> dict[str, Any]:
    binding = state.bindings.get(scenario, BASE_BINDING)
    head = state.workflow.chain.head(scenario)
    harness_release = head is not None and head.kind == "harness"
    files = state.workflow.chain.files(head.release_id) if head and harness_release else {}
    return {
        "scenario": scenario,
        "release_id": binding.release_id,
        "kind": binding.kind,
        "system_prompt": binding.system_prompt or "",
        "settings": binding.settings,
        "files": files,
    }


async def harness(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = check_scenario(request.query_params.get("scenario") or DEFAULT_SCENARIO)
    current = await run_in_threadpool(_harness, state, scenario)
    files = {path: data.decode(errors="replace") for path, data in current["files"].items()}
    return JSONResponse({**current, "files": files})


async def adapters(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": list_adapters()})


async def install(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = check_scenario(request.query_params.get("scenario") or DEFAULT_SCENARIO)
    adapter = request.query_params.get("adapter", "")
    current = await run_in_threadpool(_harness, state, scenario)
    script = render_install(
        adapter,
        base_url=str(request.base_url),
        scenario=scenario,
        release_id=current["release_id"],
        model=state.engine.model,
        files=current["files"],
        system_prompt=current["system_prompt"],
        context_window=state.config.engine.llamacpp.n_ctx,
        max_tokens=announced_max_tokens(current["settings"], state.max_tokens_for(scenario)),
    )
    return PlainTextResponse(script, media_type="text/x-shellscript")


def announced_max_tokens(settings: dict[str, Any], cap: int | None) -> int:
    """The per-call limit an agent is told: the harness's own max_tokens within the scenario's
    cap (agents may ask for more anyway; the cap then holds them to it)."""
    limits = [int(limit) for limit in (settings.get("max_tokens"), cap) if limit]
    return min(limits, default=AUTO_MAX_TOKENS)


routes = [
    Route("/reef/harness", harness, methods=["GET"]),
    Route("/reef/harness/adapters", adapters, methods=["GET"]),
    Route("/reef/harness/install", install, methods=["GET"]),
]
