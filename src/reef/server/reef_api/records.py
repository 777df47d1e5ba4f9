"""Reef's own routes: feedback reports, reading records, and status (training instructions and
the scenario routes are in `scenarios`).

Store reads never run on the event loop: a read can wait for the store's read lock (a review
search holds it), and meanwhile every other request and stream would stall. The routes that only
read are plain functions, which Starlette runs in its thread pool; the others hand their reads
to it.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.config import ReefConfig
from reef.engines.base import Slotted
from reef.errors import BadRequest, Conflict, NotFound
from reef.evaluation.health import Health, chain_health
from reef.evaluation.live import against_gate, learning_progress
from reef.inference.binding import Binding
from reef.inference.routing import Routing
from reef.releases.chain import ReleaseChain
from reef.scenario import RuntimeScenarios
from reef.sdk.recipe import RecipeError, recipe_class
from reef.server.http import parse, query_int, read_json
from reef.server.state import ServerState, scenario_from
from reef.store import Report, ReportConflict, UnknownRecords
from reef.store.learning import learning_status, with_annotations

# pydantic searches a pattern anywhere in the value, so it is anchored; its regex engine's `$`
# matches only at the very end (a trailing newline is refused).
REPORT_ID = r"^[A-Za-z0-9_.:-]{1,128}$"


class ReportRequest(BaseModel):
    """A report as Reef and upstream Reef define it: receipts (optional: a report without any is
    stored and never trains), a score and/or a feedback, opaque metadata, and an idempotency key
    under either name (`agent_record_id`, upstream's, or `report_id`)."""

    model_config = ConfigDict(extra="forbid")

    references: list[str] = Field(default_factory=list, max_length=1000)
    score: float | None = None
    feedback: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    report_id: str | None = Field(None, pattern=REPORT_ID)
    agent_record_id: str | None = Field(None, pattern=REPORT_ID)
    # A score outside the scenario's range is refused; `clamp` stores it at the nearer edge.
    clamp: bool = False

    @field_validator("score", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("score must be a number")
        if not math.isfinite(value):
            raise ValueError("score must be finite (not NaN or infinity)")
        return value

    @field_validator("metadata")
    @classmethod
    def _training_flag(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Metadata is opaque but for `training.eligible`, which must be a boolean."""
        training = (value or {}).get("training")
        if training is None:
            return value
        if not isinstance(training, dict):
            raise ValueError('metadata.training must be an object, e.g. {"eligible": false}')
        if "eligible" in training and not isinstance(training["eligible"], bool):
            raise ValueError("metadata.training.eligible must be true or false")
        return value

    @model_validator(mode="after")
    def _has_signal(self) -> ReportRequest:
        if self.score is None and self.feedback is None:
            raise ValueError("send a score, a feedback, or both")
        both = self.report_id is not None and self.agent_record_id is not None
        if both and self.report_id != self.agent_record_id:
            raise ValueError(
                "agent_record_id and report_id are two names for the report's idempotency key, "
                "and they differ: send one of them"
            )
        return self

    @property
    def key(self) -> str | None:
        """The idempotency key, whichever name it came under."""
        return self.agent_record_id or self.report_id


async def report(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = parse(ReportRequest, await read_json(request, state.config.server.max_body_bytes))
    scenario = state.scenarios.require(scenario_from(request.headers), state.config, state.bindings)
    score, warning = _in_range(state, scenario, body.score, body.clamp)
    fields: dict[str, Any] = {"id": body.key} if body.key else {}
    new = Report(
        scenario=scenario,
        references=body.references,
        score=score,
        feedback=body.feedback,
        metadata=body.metadata,
        **fields,
    )
    try:
        stored, created = await state.store.add_report_async(new)
    except UnknownRecords as error:
        raise NotFound(str(error), code="unknown_record") from None
    except ReportConflict as error:
        raise Conflict(
            f"{error}; agent_record_id and report_id name the same key",
            code="report_id_conflict",
        ) from None
    if created:
        state.metrics.reports.labels(scenario).inc()
    # Upstream Reef's answer beside Reef's own: the report's id is its record id there.
    answer = {**stored, "agent_record_id": stored["id"], "request_type": "report"}
    if warning:
        answer["warnings"] = [warning]
    return JSONResponse(answer, status_code=201 if created else 200)


def _in_range(
    state: ServerState, scenario: str, score: float | None, clamp: bool
) -> tuple[float | None, str | None]:
    """The score to store, and what was done to it: one outside the scenario's range
    (`gate.canary.score_range`) would skew every pass rate and threshold that reads it, so it is
    refused, or with `clamp` stored at the nearer edge and said."""
    low, high = state.config.gate_for(scenario).canary.score_range
    if score is None or low <= score <= high:
        return score, None
    edge = high if score > high else low
    if clamp:
        return edge, f"score {score:g} is outside [{low:g}, {high:g}]: stored as {edge:g}"
    raise BadRequest(
        f"score {score:g} is outside {scenario}'s score range [{low:g}, {high:g}] "
        f"(gate.canary.score_range): send a score from {low:g} to {high:g}, send \"clamp\": "
        f"true (`reef report --clamp`) to store it as {edge:g}, or widen "
        "gate.canary.score_range in reef.yaml",
        code="score_out_of_range",
    )


MAX_SEARCH_CHARS = 500  # the words `GET /reef/records?search=` looks for


def list_records(request: Request) -> Response:
    """A page of records (plain: Starlette runs it in its thread pool, off the event loop)."""
    state: ServerState = request.app.state.reef
    scenario = request.query_params.get("scenario") or None
    after = request.query_params.get("after") or None
    limit = query_int(request, "limit", default=50, low=1, high=1000)
    order = request.query_params.get("order", "asc")
    tags = tag_filter(request.query_params.getlist("tag"))
    search = request.query_params.get("search") or None
    if search is not None and len(search) > MAX_SEARCH_CHARS:
        raise BadRequest(f"search is {len(search)} characters: send at most {MAX_SEARCH_CHARS}")
    if order not in ("asc", "desc"):
        raise BadRequest(f"query parameter order must be asc or desc, got {order!r}")
    if order == "desc":
        if after is not None:
            raise BadRequest("`after` pages oldest-first lists: drop it, or use order=asc")
        records = state.store.latest_records(scenario, limit, tags, search)
        return _record_list(state, records, limit)
    if after is not None and not state.store.record_exists(after):
        raise NotFound(
            f"unknown record {after!r} in `after`: pass the id of a record you have read"
        )
    records = state.store.list_records(scenario, after, limit, tags, search)
    return _record_list(state, records, limit)


def tag_filter(given: list[str]) -> dict[str, str]:
    """`?tag=name:value` parameters (each may repeat): records with every one of them."""
    tags = {}
    for item in given:
        name, colon, value = item.partition(":")
        if not colon or not name:
            raise BadRequest(f"query parameter tag must be name:value, got {item!r}")
        tags[name.lower()] = value
    return tags


def _record_list(state: ServerState, records: list[dict[str, Any]], limit: int) -> Response:
    """A page of records, each with what recipes concluded about it (`annotations`)."""
    data = with_annotations(state.store, records)
    return JSONResponse({"object": "list", "data": data, "has_more": len(records) == limit})


def get_record(request: Request) -> Response:
    """One record (plain: Starlette runs it in its thread pool, off the event loop)."""
    state: ServerState = request.app.state.reef
    record_id = request.path_params["record_id"]
    record = state.store.get_record(record_id)
    if record is None:
        raise NotFound(
            f"no record {record_id!r}: use a receipt from x-reef-agent-record-id",
            code="unknown_record",
        )
    return JSONResponse(with_annotations(state.store, [record])[0])


async def status(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    store, learning = await run_in_threadpool(_store_status, state)
    return JSONResponse(
        {
            "engine": _engine_status(state),
            "uptime_s": round(time.time() - state.started_at, 3),
            "serving": {name: b.release_id for name, b in sorted(state.bindings.items())},
            "release_errors": dict(sorted(state.release_errors.items())),
            # Releases that, probed after their swap, answer otherwise than their gate judged.
            "release_mismatch": dict(sorted(state.release_mismatch.items())),
            # Scenarios whose release routes calls between arms: its policy's arms.
            "routing": {
                name: _routing_status(b.routing)
                for name, b in sorted(state.bindings.items())
                if b.routing is not None
            },
            # Candidates in shadow: what became of the copies of live calls they were sent.
            "shadows": state.shadows.status() if state.shadows else {},
            # Scenarios with a teacher: what it answered, why, and what it cost.
            "teachers": {name: t.costs.to_json() for name, t in sorted(state.teachers.items())},
            # Canaries this server judges: candidate id -> the latest verdict.
            "canaries": {key: v.to_json() for key, v in sorted(state.canaries.items())},
            "releases": _releases_status(state),
            "store": {**store, "dialect": state.store.dialect},
            "learning": {
                "recipe": state.config.learning.recipe,
                "mode": state.config.learning.mode,
                "scenarios": learning,
            },
        }
    )


def _releases_status(state: ServerState) -> dict[str, Any]:
    """Where the release chain lives, and, with a shared remote, whether this replica reaches
    it (a replica that cannot keeps serving what it has)."""
    remote = state.workflow.chain.remote
    return {"remote": None if remote is None else remote.state.to_json()}


def _store_status(state: ServerState) -> tuple[dict[str, Any], dict[str, Any]]:
    """The store's counts and the learning worker's status (blocking: reads the store, and
    loads the configured recipes for their names)."""
    learning = _with_plans(state.config, state.scenarios, learning_status(state.store))
    chain = state.workflow.chain
    heads = chain.head_commits()
    for scenario, releases in learning_progress(state.store, state.config).items():
        health = _chain_health(chain, scenario, heads[scenario]) if scenario in heads else {}
        rows = [
            r.to_json()
            | against_gate(chain.evaluation_of(r.release_id), r)
            | {"health": _health(health.get(r.release_id))}
            for r in releases
        ]
        learning.setdefault(scenario, {})["progress"] = rows
    return state.store.stats(), learning


@functools.lru_cache(maxsize=64)
def _chain_health(chain: ReleaseChain, scenario: str, head: str) -> dict[str, Health]:
    """Each release's health on `scenario`'s chain, read once per head commit (status is
    polled, and a chain only changes at its head)."""
    newest_first = [(r.release_id, r.evaluation) for r in chain.releases(scenario)]
    return chain_health(newest_first[::-1])


def _health(found: Health | None) -> dict[str, Any] | None:
    """A release's forgetting and transfer (`reef.evaluation.health`), and the two said."""
    return found.to_json() | {"said": found.said()} if found else None


def _with_plans(
    config: ReefConfig, runtime: RuntimeScenarios, learning: dict[str, Any]
) -> dict[str, Any]:
    """Each learning scenario's status, with its configured mode, the mode it learns in now
    (`training_mode`: chosen with POST /reef/scenarios/{s}/update, else the configured one) and
    its configured recipes (`plan`: each reference and its name); its `recipes` hold each
    recipe's step count and last step, by name."""
    scenarios = {name: dict(found) for name, found in learning.items()}
    for plan in config.learning_plans():
        found = scenarios.setdefault(plan.scenario, {})
        found["mode"] = plan.mode
        found["training_mode"] = runtime.training_mode(plan.scenario, plan.mode)
        found["plan"] = [{"recipe": c.recipe, "name": recipe_name(c.recipe)} for c in plan.recipes]
    return scenarios


@functools.lru_cache(maxsize=64)
def recipe_name(reference: str) -> str:
    """The name a configured recipe's steps are recorded under (loaded once per reference:
    status is polled, and finding an entry point scans every installed package)."""
    try:
        return recipe_class(reference).name
    except RecipeError:  # checked at start; a file edited since may no longer load
        return reference


def _routing_status(routing: Routing[Binding]) -> dict[str, Any]:
    routes = [
        {
            "when": {"headers": dict(route.headers)} if route.headers else None,
            "arms": [
                {"name": arm.name, "share": arm.share, "release": arm.binding.release_id}
                for arm in arms
            ],
        }
        for route, arms in routing.routes
    ]
    return {"release_id": routing.release_id, "routes": routes}


def _engine_status(state: ServerState) -> dict[str, Any]:
    engine = state.engine
    slotted = engine if isinstance(engine, Slotted) else None
    return {
        "name": engine.name,
        "model": engine.model,
        "reason": state.engine_reason,
        "token_ids": engine.capabilities.token_ids,
        "logprobs": engine.capabilities.logprobs,
        # Engines with slots (llama.cpp) say how many requests they hold; their prompt tokens,
        # and how many came from a cache; their KV cache's capacity and memory; the checkpoint
        # releases' models loaded beside their own, by release.
        "in_flight": slotted.in_flight if slotted else None,
        "prompt_cache": slotted.cache_counters if slotted else None,
        "loops_stopped": slotted.loops_stopped if slotted else None,
        "kv_cache": slotted.kv_cache if slotted else None,
        "prefill": slotted.prefill if slotted else None,
        "checkpoints": slotted.checkpoints_loaded if slotted else None,
    }


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/reef/report", report, methods=["POST"]),
    Route("/reef/records", list_records, methods=["GET"]),
    Route("/reef/records/{record_id}", get_record, methods=["GET"]),
    Route("/reef/status", status, methods=["GET"]),
]
