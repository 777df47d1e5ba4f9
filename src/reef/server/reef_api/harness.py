"""Harness routes: a scenario's harness (the serving release's, or a past one's), its releases
with the gate's verdict on each, a page per release, the adapters and their install scripts.

The scenario comes from the `x-reef-scenario` header or `?scenario=` (a header and a query that
disagree are refused: neither is guessed). The manifest answers what upstream Reef's clients
read (`release_id`, `content_id`, `parent_release_id`, `files`, `gate`, `requires`, and
`artifact_version` for `reef_client.harness_pull`) beside Reef's own fields.
"""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from reef.artifacts import ADAPTER, HARNESS, files_of, part_of
from reef.config import AUTO_MAX_TOKENS
from reef.errors import BadRequest, NotFound
from reef.harness.installers import list_adapters, render_install
from reef.inference.binding import (
    BASE_BINDING,
    BASE_RELEASE,
    compose_system_prompt,
    load_settings,
)
from reef.releases.chain import Release, content_hash, is_weight_file, lfs_size, scenario_of
from reef.scenario import scenario_named
from reef.server.state import ServerState

# The parts of a gate's evaluation summary that a release listing shows: the figures, without
# each task's answers (`GET /reef/review/candidates/{id}` has those).
GATE_FIELDS = (
    "current_release_id",
    "tasks",
    "current_mean",
    "candidate_mean",
    "wins",
    "losses",
    "ties",
    "lost",
    "groups",
)


def scenario_of_request(request: Request) -> str:
    """The scenario a harness route is asked about: `x-reef-scenario`, or `?scenario=`."""
    given = request.query_params.get("scenario") or None
    return scenario_named(request.headers, given, "the scenario query parameter")


def wanted_release(request: Request, scenario: str) -> str | None:
    """The past release `?release_id=` (or its alias `?version=`) asks for; None: the serving
    one. A bare number N is the scenario's release N."""
    asked = {
        name: value
        for name in ("release_id", "version")
        if (value := request.query_params.get(name))
    }
    if len(set(asked.values())) > 1:
        raise BadRequest(
            f"?release_id={asked['release_id']!r} and ?version={asked['version']!r} name "
            "different releases: send one of them"
        )
    if not asked:
        return None
    value = next(iter(asked.values()))
    if value.isdigit() and len(value) <= 9:
        return f"{scenario}@{int(value)}"
    if value != BASE_RELEASE and scenario_of(value) != scenario:  # 404 for a malformed id
        raise NotFound(
            f"{value} is a release of scenario {scenario_of(value)!r}, not of {scenario!r}: "
            f"send x-reef-scenario: {scenario_of(value)}, or a release of {scenario!r}",
            code="unknown_release",
        )
    return value


def gate_of(release: Release | None) -> dict[str, Any] | None:
    """The figures of the gate's evaluation that published `release` (copied along by a
    rollback or promote); None where no evaluation ran (the base, `gate.policy: always`)."""
    evaluation = release.evaluation if release is not None else None
    if not evaluation:
        return None
    return {name: evaluation[name] for name in GATE_FIELDS if name in evaluation}


def _harness(state: ServerState, scenario: str, release_id: str | None = None) -> dict[str, Any]:
    """The manifest of `release_id`, or of the release the scenario serves now: its files (the
    harness and any notes beside it, as stored; adapter files by size), the composed system
    prompt and settings, and the gate's figures (blocking: reads the release chain)."""
    binding = state.bindings.get(scenario, BASE_BINDING)
    chain = state.workflow.chain
    serving_id = binding.release_id
    chosen = serving_id if release_id is None else release_id
    release = None if chosen == BASE_RELEASE else chain.get(chosen)
    stored = chain.stored_files(chosen) if release is not None else {}  # weights as pointers
    files = {
        path: data
        for path, data in stored.items()
        if part_of(path) != ADAPTER and not is_weight_file(path)
    }
    adapter = {
        path: lfs_size(data) if is_weight_file(path) else len(data)
        for path, data in files_of(stored, ADAPTER).items()
    }
    if chosen == serving_id:
        system_prompt, settings = binding.system_prompt or "", binding.settings
    else:
        system_prompt, settings = _composed(release, files)
    return {
        "scenario": scenario,
        "release_id": chosen,
        "artifact_version": chosen,
        "content_id": release.content_hash if release is not None else content_hash({}),
        "parent_release_id": release.parent_release_id if release is not None else None,
        "kind": binding.kind if release is None else release.kind,
        "parts": release.carried_parts if release is not None else [],
        "serving": chosen == serving_id,
        "system_prompt": system_prompt,
        "settings": settings,
        "files": files,
        "adapter": {"files": adapter} if adapter else None,
        "gate": gate_of(release),
        "requires": [],
    }


def _composed(release: Release | None, files: dict[str, bytes]) -> tuple[str, dict[str, Any]]:
    """The system prompt and settings a past release's harness composes to, as it would serve."""
    if release is None or HARNESS not in release.carried_parts:
        return "", {}
    with tempfile.TemporaryDirectory(prefix="reef-harness-") as folder:
        root = Path(folder)
        for path, data in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return compose_system_prompt(root), load_settings(root)


async def harness(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    release_id = wanted_release(request, scenario)
    current = await run_in_threadpool(_harness, state, scenario, release_id)
    files = {path: data.decode(errors="replace") for path, data in current["files"].items()}
    return JSONResponse(
        {**current, "files": files}, headers={"x-reef-release-id": current["release_id"]}
    )


# -- the releases -----------------------------------------------------------------------------


def release_row(release: Release, serving_id: str, head_id: str | None) -> dict[str, Any]:
    """One release as the harness listings show it."""
    origin = release.origin or {}
    return {
        "release_id": release.release_id,
        "artifact_version": release.release_id,
        "version": release.number,
        "parent_release_id": release.parent_release_id,
        "kind": release.kind,
        "parts": release.carried_parts,
        "created_at": release.created_at,
        "content_id": release.content_hash,
        "candidate_id": release.candidate_id,
        "records_consumed": release.records_consumed,
        "reason": release.reason,
        "operation": origin.get("action", "publish"),
        "copy_of": origin.get("release_id"),
        "gate": gate_of(release),
        "serving": release.release_id == serving_id,
        "head": release.release_id == head_id,
        "page": f"/reef/harness/releases/{release.release_id}/page",
    }


def base_row(serving_id: str, head_id: str | None) -> dict[str, Any]:
    """Where every scenario starts, as upstream's catalog lists a scenario's starting release:
    the base model with no harness (an empty tree), pullable as `?release_id=base`."""
    return {
        "release_id": BASE_RELEASE,
        "artifact_version": BASE_RELEASE,
        "version": 0,
        "parent_release_id": None,
        "kind": "base",
        "parts": [],
        "created_at": None,
        "content_id": content_hash({}),
        "candidate_id": None,
        "records_consumed": 0,
        "reason": "the base model with no harness: where the scenario starts",
        "operation": "start",
        "copy_of": None,
        "gate": None,
        "serving": serving_id == BASE_RELEASE,
        "head": head_id is None,
        "page": None,
    }


def _harness_releases(state: ServerState, scenario: str) -> list[dict[str, Any]]:
    """The scenario's releases that carry a harness, oldest first, after its starting point,
    the base (blocking)."""
    releases = state.workflow.chain.releases(scenario)  # newest first
    serving_id = state.bindings.get(scenario, BASE_BINDING).release_id
    head_id = releases[0].release_id if releases else None
    return [base_row(serving_id, head_id)] + [
        release_row(release, serving_id, head_id)
        for release in reversed(releases)
        if HARNESS in release.carried_parts
    ]


async def versions(request: Request) -> Response:
    """`reef_client.harness_versions` reads `versions`, newest last."""
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    rows = await run_in_threadpool(_harness_releases, state, scenario)
    return JSONResponse({"object": "list", "scenario": scenario, "versions": rows})


async def releases(request: Request) -> Response:
    """Upstream Reef's catalog shape, `{scenario, releases}`, oldest first."""
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    rows = await run_in_threadpool(_harness_releases, state, scenario)
    return JSONResponse({"object": "list", "scenario": scenario, "releases": rows})


# -- one page per release ---------------------------------------------------------------------

_PAGE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ row.release_id }} · Reef harness release</title>
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
pre{background:#f5f5f5;padding:.75rem;overflow-x:auto}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .6rem;text-align:left}
.serving{color:#070}
</style></head><body>
<h1>{{ row.release_id }}</h1>
<p>{{ row.kind }} release of scenario <b>{{ row.scenario }}</b>, published {{ created }}
{%- if row.serving %} · <span class="serving">serving now</span>{% endif %}
{%- if row.head and not row.serving %} · the head (not serving here){% endif %}</p>
<h2>Why</h2>
<p>{{ row.reason or "no reason was given" }}</p>
{% if row.candidate_id %}<p>From candidate {{ row.candidate_id }}, built from
{{ row.records_consumed }} record(s).</p>{% endif %}
<h2>What changed</h2>
{% if row.copy_of %}<p>A {{ row.operation }}: the same files as
<a href="{{ page(row.copy_of) }}">{{ row.copy_of }}</a>.</p>{% endif %}
{% if diff %}<pre>{{ diff }}</pre>{% else %}<p>No text file changed.</p>{% endif %}
<h2>Verdict</h2>
{% if gate %}
<table>
<tr><th>against</th><td>{{ gate.current_release_id }}</td></tr>
<tr><th>tasks</th><td>{{ gate.tasks }}</td></tr>
<tr><th>mean score, current → this</th>
<td>{{ gate.current_mean }} → {{ gate.candidate_mean }}</td></tr>
<tr><th>wins · losses · ties</th><td>{{ gate.wins }} · {{ gate.losses }} · {{ gate.ties }}</td></tr>
{% if gate.lost %}<tr><th>regressed tasks</th><td>{{ gate.lost | join(", ") }}</td></tr>{% endif %}
</table>
{% else %}<p>No evaluation ran: released without the gate's paired evaluation.</p>{% endif %}
<h2>Chain</h2>
<ul>
<li>parent: {% if row.parent_release_id %}<a href="{{ page(row.parent_release_id) }}">
{{- row.parent_release_id }}</a>{% else %}none (the first release){% endif %}</li>
<li>this: {{ row.release_id }}</li>
<li>next: {% if next %}<a href="{{ page(next) }}">{{ next }}</a>{% else %}none yet{% endif %}</li>
{% for copy in copies %}<li>copied by
<a href="{{ page(copy.release_id) }}">{{ copy.release_id }}</a> ({{ copy.operation }})</li>
{% endfor %}
</ul>
<script type="application/json" id="release">{{ data | safe }}</script>
</body></html>
"""
)


def _page(state: ServerState, scenario: str, asked: str) -> str:
    """The HTML page of one release (blocking: reads the chain)."""
    release_id = f"{scenario}@{int(asked)}" if asked.isdigit() and len(asked) <= 9 else asked
    chain = state.workflow.chain
    release = chain.get(release_id)  # 404 for an unknown or malformed id
    serving_id = state.bindings.get(release.scenario, BASE_BINDING).release_id
    chain_rows = chain.releases(release.scenario)
    head_id = chain_rows[0].release_id if chain_rows else None
    row = {**release_row(release, serving_id, head_id), "scenario": release.scenario}
    later = [r for r in chain_rows if r.parent_release_id == release.release_id]
    copies = [
        release_row(r, serving_id, head_id)
        for r in reversed(chain_rows)
        if (r.origin or {}).get("release_id") == release.release_id
    ]
    # In a <script> block only `<` can end it early; escaping it keeps the JSON valid.
    data = json.dumps(row, ensure_ascii=False).replace("<", "\\u003c")
    return _PAGE.render(
        row=row,
        created=datetime.fromtimestamp(release.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC"),
        diff=release.diff or "",
        gate=row["gate"],
        next=later[0].release_id if later else None,
        copies=copies,
        page=lambda other: f"/reef/harness/releases/{other}/page",
        data=data,
    )


async def release_page(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    text = await run_in_threadpool(_page, state, scenario, request.path_params["release_id"])
    return HTMLResponse(text)


# -- adapters and install scripts -------------------------------------------------------------


def adapters(request: Request) -> Response:
    """The adapters (plain: Starlette runs it in its thread pool, as it reads their files)."""
    return JSONResponse({"object": "list", "data": list_adapters()})


async def install(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    release_id = wanted_release(request, scenario)
    adapter = request.query_params.get("adapter", "")
    base_url = str(request.base_url)
    script = await run_in_threadpool(
        _install_script, state, adapter, scenario, base_url, release_id
    )
    return PlainTextResponse(script, media_type="text/x-shellscript")


def _install_script(
    state: ServerState, adapter: str, scenario: str, base_url: str, release_id: str | None = None
) -> str:
    """`adapter`'s install script for the scenario's serving harness, or `release_id`'s
    (blocking: reads the release chain and the adapter's template)."""
    current = _harness(state, scenario, release_id)
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
    Route("/reef/harness/versions", versions, methods=["GET"]),
    Route("/reef/harness/releases", releases, methods=["GET"]),
    Route("/reef/harness/releases/{release_id}/page", release_page, methods=["GET"]),
    Route("/reef/harness/adapters", adapters, methods=["GET"]),
    Route("/reef/harness/install", install, methods=["GET"]),
]
