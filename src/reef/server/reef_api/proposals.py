"""`POST /reef/harness/proposals`: an agent running on a scenario's tree proposes a change to it.

Upstream Reef's shape: `{mutations, reason, session, release_id}`, each mutation Reef's
`{op, path, content}` or upstream's entry `{op, id, options: {name, config: {text}}}`. The
mutations are admitted against the head's tree with the rules every change meets
(`reef.harness.mutations`); the answer is `{proposal_id, admitted, reason, release_id}`, the
reason naming the rule that refused (null when admitted), the release the head was. An admitted
proposal is a candidate (`source: agent`) that the scenario's learning worker gates at its next
step before its recipe is asked, or that `reef release approve` decides; nothing it says serves
until then.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.artifacts import HARNESS, files_of, keep_serving_parts
from reef.errors import BadRequest
from reef.harness.mutations import MutationRefused, apply, mutation_from
from reef.releases.workflow import CandidateRefused
from reef.server.http import read_json
from reef.server.reef_api.harness import scenario_of_request
from reef.server.state import ServerState
from reef.store.candidates import AGENT_SOURCE

MAX_MUTATIONS = 16
MAX_BODY_BYTES = 256 * 1024


async def propose(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = scenario_of_request(request)
    body = await read_json(request, MAX_BODY_BYTES)
    mutations, reason, session, running = _fields(body)
    answer = await run_in_threadpool(_admit, state, scenario, mutations, reason, session, running)
    return JSONResponse(answer)


def _fields(body: dict[str, Any]) -> tuple[list[Any], str, str | None, str | None]:
    """The body's fields, checked: (mutations, reason, session, release_id)."""
    unknown = set(body) - {"mutations", "reason", "session", "release_id"}
    if unknown:
        listed = ", ".join(sorted(unknown))
        raise BadRequest(f"unknown key(s) {listed}: send mutations, reason, session, release_id")
    mutations = body.get("mutations")
    if not isinstance(mutations, list) or not mutations:
        raise BadRequest("mutations must be a non-empty list of {op, path, content}")
    if len(mutations) > MAX_MUTATIONS:
        raise BadRequest(f"at most {MAX_MUTATIONS} mutations in one proposal")
    reason, session, running = body.get("reason", ""), body.get("session"), body.get("release_id")
    if not isinstance(reason, str) or not all(
        value is None or isinstance(value, str) for value in (session, running)
    ):
        raise BadRequest("reason, session and release_id must be strings")
    # Provenance, kept in the candidate's reason: bounded, as a session header is.
    return mutations, reason.strip()[:1000], _bounded(session), _bounded(running)


def _bounded(value: str | None) -> str | None:
    return value[:256] if value else None


def _admit(
    state: ServerState,
    scenario: str,
    mutations: list[Any],
    reason: str,
    session: str | None,
    running: str | None,
) -> dict[str, Any]:
    """Admit the mutations against the head's tree, and the tree they make as a candidate."""
    workflow = state.workflow
    head = workflow.chain.head(scenario)
    head_id = head.release_id if head else "base"
    serving = workflow.chain.files(head.release_id) if head else {}
    tree = files_of(serving, HARNESS)
    try:
        for data in mutations:
            tree = apply(tree, mutation_from(data, reason))
    except MutationRefused as refused:
        return _refused(refused.message, head_id)
    kind, files = keep_serving_parts("harness", tree, serving)
    said = f"proposed by session {session}" if session else "proposed by an agent"
    ran = f" on {running}" if running and running != head_id else ""
    try:
        candidate = workflow.propose(
            scenario,
            kind,
            files,
            source=AGENT_SOURCE,
            reason=f"{said}{ran}: {reason or 'no reason'}",
        )
    except CandidateRefused as refused:  # a tree that would not serve (stored as rejected)
        return _refused(refused.message, head_id)
    return {"proposal_id": candidate.id, "admitted": True, "reason": None, "release_id": head_id}


def _refused(rule: str, head_id: str) -> dict[str, Any]:
    return {"proposal_id": None, "admitted": False, "reason": rule, "release_id": head_id}


routes = [Route("/reef/harness/proposals", propose, methods=["POST"])]
