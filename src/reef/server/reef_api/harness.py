"""Harness routes: a scenario's current harness, the adapters, and their install scripts."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from reef.artifacts import ADAPTER, files_of, part_of
from reef.config import AUTO_MAX_TOKENS
from reef.harness.installers import list_adapters, render_install
from reef.inference.binding import BASE_BINDING
from reef.releases.chain import is_weight_file, lfs_size
from reef.scenario import DEFAULT_SCENARIO, check_scenario
from reef.server.state import ServerState


def _harness(state: ServerState, scenario: str) -> dict[str, Any]:
    """The scenario's binding, the parts its head carries, its harness files and its adapter's
    files with their sizes (blocking: reads the release chain)."""
    binding = state.bindings.get(scenario, BASE_BINDING)
    chain = state.workflow.chain
    head = chain.head(scenario)
    stored = chain.stored_files(head.release_id) if head else {}  # weights as LFS pointers
    # The harness and any notes beside it, as stored: only weight files are LFS pointers there.
    files = {
        path: data
        for path, data in stored.items()
        if part_of(path) != ADAPTER and not is_weight_file(path)
    }
    adapter = {
        path: lfs_size(data) if is_weight_file(path) else len(data)
        for path, data in files_of(stored, ADAPTER).items()
    }
    return {
        "scenario": scenario,
        "release_id": binding.release_id,
        "kind": binding.kind,
        "parts": head.carried_parts if head else [],
        "system_prompt": binding.system_prompt or "",
        "settings": binding.settings,
        "files": files,
        "adapter": {"files": adapter} if adapter else None,
    }


async def harness(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = check_scenario(request.query_params.get("scenario") or DEFAULT_SCENARIO)
    current = await run_in_threadpool(_harness, state, scenario)
    files = {path: data.decode(errors="replace") for path, data in current["files"].items()}
    return JSONResponse({**current, "files": files})


def adapters(request: Request) -> Response:
    """The adapters (plain: Starlette runs it in its thread pool, as it reads their files)."""
    return JSONResponse({"object": "list", "data": list_adapters()})


async def install(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = check_scenario(request.query_params.get("scenario") or DEFAULT_SCENARIO)
    adapter = request.query_params.get("adapter", "")
    base_url = str(request.base_url)
    script = await run_in_threadpool(_install_script, state, adapter, scenario, base_url)
    return PlainTextResponse(script, media_type="text/x-shellscript")


def _install_script(state: ServerState, adapter: str, scenario: str, base_url: str) -> str:
    """`adapter`'s install script for the scenario's current harness (blocking: reads the
    release chain and the adapter's template)."""
    current = _harness(state, scenario)
    return render_install(
        adapter,
        base_url=base_url,
        scenario=scenario,
        release_id=current["release_id"],
        model=state.engine.model,
        files=current["files"],
        system_prompt=current["system_prompt"],
        context_window=state.config.engine.llamacpp.n_ctx,
        max_tokens=announced_max_tokens(current["settings"], state.max_tokens_for(scenario)),
    )


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
