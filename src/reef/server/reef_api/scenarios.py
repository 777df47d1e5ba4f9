"""Scenario routes: create a scenario, read what it accepts, switch its training mode, and queue
training instructions for it (`POST /reef/train`, in Reef's shape and in upstream Reef's).

A scenario created here, and the training mode chosen for one, are runtime state of this server
(`ServerState.scenarios`, in memory): a restart forgets them. A scenario created with a
`release_id` is durable, as the release it now serves.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.config import LearningPlan
from reef.errors import BadRequest, Conflict, Forbidden
from reef.scenario import check_scenario, scenario_named
from reef.server.auth import caller_is_admin
from reef.server.http import parse, read_json
from reef.server.reef_api.records import REPORT_ID, recipe_name
from reef.server.start_release import start_needs_admin
from reef.server.state import ServerState
from reef.store.learning import queue_instruction, queue_instruction_once

MAX_INSTRUCTION = 4000
MAX_REQUIRES = 8


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.reef
    return state


def _plan(state: ServerState, scenario: str) -> LearningPlan | None:
    return next((p for p in state.config.learning_plans() if p.scenario == scenario), None)


def _path_scenario(request: Request) -> str:
    """The scenario in the path; an `x-reef-scenario` header, if sent, must name the same."""
    return scenario_named(request.headers, str(request.path_params["scenario"]), "the path")


def _exists(state: ServerState, name: str) -> bool:
    """Known to this server, or with records or releases in its store and chain (blocking)."""
    if state.scenarios.knows(name, state.config, state.bindings):
        return True
    return name in state.store.stats()["scenarios"] or name in state.workflow.chain.scenarios()


# -- POST /reef/scenarios --------------------------------------------------------------------


class CreateScenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    # A release (of any scenario) the new scenario starts serving: published on it as a copy.
    release_id: str | None = Field(None, min_length=1, max_length=200)


async def create_scenario(request: Request) -> Response:
    state = _state(request)
    body = parse(CreateScenario, await read_json(request, state.config.server.max_body_bytes))
    name = scenario_named(request.headers, check_scenario(body.name), "the body's name")
    if body.release_id is not None and not caller_is_admin(request.scope):
        raise Forbidden(start_needs_admin(name, body.release_id))
    answer, created = await run_in_threadpool(_create, state, name, body.release_id)
    return JSONResponse(answer, status_code=201 if created else 200)


def _create(state: ServerState, name: str, release_id: str | None) -> tuple[dict[str, Any], bool]:
    """Create `name` (blocking). Under the registry's lock, so that of two identical requests
    racing, one creates and the other finds it created."""
    chain = state.workflow.chain
    with state.scenarios.lock:
        existed = _exists(state, name)
        head = chain.head(name)
        if release_id is not None:
            source = chain.get(release_id)  # 404 names an unknown release
            if head is None:
                reason = "scenario created with POST /reef/scenarios"
                head = chain.promote(release_id, name, reason, expected_head=None)
                existed = False
            elif head.content_hash != source.content_hash:
                raise Conflict(
                    f"scenario {name!r} exists and serves {head.release_id}, which is not a copy "
                    f"of {release_id}: to serve {release_id} on it, POST "
                    f'/reef/scenarios/{name}/promote {{"release_id": "{release_id}"}}',
                    code="scenario_exists",
                )
        state.scenarios.create(name, release_id)
    serving = state.bindings.get(name)
    answer = {
        "scenario": name,
        "release_id": head.release_id if head else serving.release_id if serving else "base",
        "content_id": head.content_hash if head else None,
    }
    return answer, not existed


# -- GET /reef/scenarios/{scenario}/contract -------------------------------------------------

# What `POST /reef/report` accepts, the same for every scenario (recipes declare no schema).
REPORT_FIELDS = {
    "references": "up to 1000 receipts (x-reef-agent-record-id) of this scenario; a report "
    "without any is stored and never trains",
    "score": "a finite number (not a boolean)",
    "feedback": "a string or an object",
    "metadata": "an object, opaque but for training.eligible (false: stored, never trains)",
    "agent_record_id": "the report's idempotency key (report_id is the same key)",
}


def contract(request: Request) -> Response:
    """What the scenario accepts (plain: Starlette runs it in its thread pool)."""
    state = _state(request)
    scenario = _path_scenario(request)
    if not state.config.server.allow_implicit_scenario_creation and not _exists(state, scenario):
        state.scenarios.require(scenario, state.config, state.bindings)  # the 404
    plan = _plan(state, scenario)
    mode = state.scenarios.training_mode(scenario, plan.mode) if plan else None
    configured = plan.recipes if plan else ()
    recipes = [{"recipe": c.recipe, "name": recipe_name(c.recipe)} for c in configured]
    types = ["inference", "report"] + (["train"] if mode in ("manual", "hybrid") else [])
    return JSONResponse(
        {
            "scenario": scenario,
            "processor": recipes[0]["name"] if recipes else None,
            "recipes": recipes,
            "training_mode": mode,
            "required_request_types": types,
            "report": {
                "fields": REPORT_FIELDS,
                "one_of_required": ["score", "feedback"],
                "score_range": list(state.config.gate_for(scenario).canary.score_range),
            },
        }
    )


# -- POST /reef/scenarios/{scenario}/update --------------------------------------------------


class UpdateScenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training_mode: Literal["auto", "manual", "hybrid"]


async def update_scenario(request: Request) -> Response:
    state = _state(request)
    scenario = _path_scenario(request)
    body = parse(UpdateScenario, await read_json(request, state.config.server.max_body_bytes))
    plan = _learning_plan(state, scenario)
    # In the store, so the learning worker and every replica learn in it.
    await run_in_threadpool(state.scenarios.select_mode, plan.scenario, body.training_mode)
    return JSONResponse({"scenario": scenario, "training_mode": body.training_mode})


def _learning_plan(state: ServerState, scenario: str) -> LearningPlan:
    state.scenarios.require(scenario, state.config, state.bindings)
    plan = _plan(state, scenario)
    if plan is None:
        raise Conflict(
            f"scenario {scenario!r} does not learn: set learning.recipe in reef.yaml (or "
            f"scenarios.{scenario}.learning.recipe)",
            code="no_recipe",
        )
    return plan


# -- POST /reef/train --------------------------------------------------------------------------


class Requirement(BaseModel):
    """What a change needs from the person's machine (upstream Reef's `requires` item)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: Literal["permission", "env", "service"]
    check: str | None = Field(None, max_length=1000)


class TrainRequest(BaseModel):
    """Reef's `{scenario, instruction}`, or upstream Reef's `{text, session, release_id,
    agent_record_id?, requires?}` with the scenario in `x-reef-scenario`. The text's length is
    checked by `_screen`, whose messages never repeat it."""

    model_config = ConfigDict(extra="forbid")

    scenario: str | None = None
    instruction: str | None = None
    text: str | None = None
    session: str | None = Field(None, min_length=1, max_length=256)
    release_id: str | None = Field(None, min_length=1, max_length=200)
    agent_record_id: str | None = Field(None, pattern=REPORT_ID)
    requires: list[Requirement] = Field(default_factory=list, max_length=MAX_REQUIRES)


async def train(request: Request) -> Response:
    """Queue an instruction for the learning worker (manual and hybrid modes act on it)."""
    state = _state(request)
    body = parse(TrainRequest, await read_json(request, state.config.server.max_body_bytes))
    scenario = scenario_named(request.headers, body.scenario, "the body's scenario")
    text = _instruction(body)
    plan = _learning_plan(state, scenario)
    mode = state.scenarios.training_mode(scenario, plan.mode)
    if mode == "auto":
        raise Conflict(
            f"{scenario} learns in auto mode: instructions need mode manual or hybrid "
            f"({plan.key}.mode, or POST /reef/scenarios/{scenario}/update "
            '{"training_mode": "hybrid"})',
            code="wrong_mode",
        )
    provenance = _provenance(body)
    if body.agent_record_id is None:
        request_id = await run_in_threadpool(
            queue_instruction, state.store, scenario, text, provenance
        )
        created = True
    else:
        request_id = body.agent_record_id
        created = await run_in_threadpool(
            queue_instruction_once, state.store, request_id, scenario, text, provenance
        )
    answer = {
        "id": request_id,
        "scenario": scenario,
        "agent_record_id": request_id,
        "request_type": "train",
    }
    return JSONResponse(answer, status_code=202 if created else 200)


def _provenance(body: TrainRequest) -> dict[str, Any] | None:
    """Where the instruction came from, kept with it and then on the candidate it leads to."""
    fields: dict[str, Any] = {"session": body.session, "release_id": body.release_id}
    if body.requires:
        fields["requires"] = [item.model_dump(exclude_none=True) for item in body.requires]
    kept = {key: value for key, value in fields.items() if value}
    return kept or None


def _instruction(body: TrainRequest) -> str:
    """The instruction's text, in either shape, screened; refusals name the field and rule."""
    if (body.instruction is None) == (body.text is None):
        raise BadRequest(
            "send the instruction as `text` (with `session` and `release_id`) or as "
            "`instruction`, one of the two"
        )
    if body.text is not None:
        missing = [name for name in ("session", "release_id") if getattr(body, name) is None]
        if missing:
            raise BadRequest(
                f"`text` needs {' and '.join(missing)}: the session that asked and the release "
                "it ran (provenance; send strings)"
            )
    field, text = ("instruction", body.instruction) if body.text is None else ("text", body.text)
    assert text is not None
    _screen(field, text, MAX_INSTRUCTION)
    for index, item in enumerate(body.requires):
        _screen(f"requires.{index}.name", item.name, 64)
        if item.check is not None:
            _screen(f"requires.{index}.check", item.check, 1000)
        variable = item.check if item.check is not None else item.name
        if item.kind == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
            raise BadRequest(
                f"requires.{index}: an env item names a shell variable "
                "(letters, digits and '_', not starting with a digit) in check, else in name"
            )
    return text


# Credential-shaped literals and instruction-override phrasings, by the rule a refusal names.
# Instructions are stored and read by a proposer model, so neither may go in.
CREDENTIALS = [
    ("an API key (sk-…)", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("a GitHub token (ghp_…, github_pat_…)", re.compile(r"\b(gh[pousr]_|github_pat_)\w{20,}")),
    ("an AWS access key (AKIA…)", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Slack token (xox…-)", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a JSON web token", re.compile(r"\beyJ[\w-]{10,}\.[\w-]{10,}\.")),
    ("a long hex token", re.compile(r"\b[0-9a-fA-F]{32,}\b")),
    (
        "a password or secret assignment (password=…)",
        re.compile(
            r"\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token)\s*[=:]\s*\S", re.I
        ),
    ),
]
# A run of 40 or more base64 characters with upper case, lower case and digits (a word or a path
# lacks one of them).
BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{40,}={0,2}")
_PREVIOUS = r"(all\s+|any\s+|the\s+|your\s+)*(previous|prior|above|earlier|preceding|system)"
_RULES = r"(instructions?|prompts?|rules|messages|directions|guidelines)"
DIRECTIVES = [
    (
        "an instruction override (ignore previous instructions)",
        re.compile(rf"\b(ignore|disregard|forget|override)\s+{_PREVIOUS}\s+{_RULES}", re.I),
    ),
    (
        "an instruction override (you are now…)",
        re.compile(
            r"\byou\s+are\s+now\s+(in\s+)?(dan|developer\s+mode|jailbroken|unrestricted)", re.I
        ),
    ),
]


def _screen(field: str, text: str, limit: int) -> None:
    """Refuse an empty or over-long `text`, or one with a credential or an instruction override,
    naming `field` and the rule, never the text."""
    if not text.strip():
        raise BadRequest(f"{field} is empty: say what the change should do", code="empty_text")
    if len(text) > limit:
        raise BadRequest(
            f"{field} is {len(text)} characters, over the limit of {limit}: shorten it",
            code="text_too_long",
        )
    for rule, pattern in CREDENTIALS:
        if pattern.search(text):
            _refuse(field, f"it carries {rule}", "remove the secret; name the variable instead")
    for run in BASE64_RUN.findall(text):
        if re.search(r"[A-Z]", run) and re.search(r"[a-z]", run) and re.search(r"[0-9]", run):
            _refuse(field, "it carries a long base64 token", "remove the secret")
    for rule, pattern in DIRECTIVES:
        if pattern.search(text):
            _refuse(field, f"it reads as {rule}", "say what the change should do instead")


def _refuse(field: str, why: str, fix: str) -> None:
    raise BadRequest(f"{field} refused: {why}; {fix}, and send it again", code="text_refused")




routes = [
    Route("/reef/scenarios", create_scenario, methods=["POST"]),
    Route("/reef/scenarios/{scenario}/contract", contract, methods=["GET"]),
    Route("/reef/scenarios/{scenario}/update", update_scenario, methods=["POST"]),
    Route("/reef/train", train, methods=["POST"]),
]
