"""`x-reef-release-id` on an inference call (upstream Reef's request header): the release a
scenario starts from.

On a scenario that has no release yet and was never created, the call creates it serving a copy
of that release (published as its first release, as `POST /reef/scenarios` with `release_id`
does), and is answered by it. On a scenario that exists, the header must name the release it
started from (`base` for one that started from the model alone): another is a 409 that names
both. The call is then served by the scenario's current release, as every call is.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.errors import Conflict, Forbidden, ReefError
from reef.inference.binding import BASE_RELEASE
from reef.server.auth import INFERENCE_PATHS, caller_is_admin, refuse
from reef.server.state import ServerState, scenario_from

HEADER = "x-reef-release-id"


class BindStartRelease:
    """ASGI middleware, inside authentication: a call's `x-reef-release-id` checked or bound."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in INFERENCE_PATHS:
            headers = Headers(scope=scope)
            wanted = headers.get(HEADER)
            if wanted:
                try:
                    scenario = scenario_from(headers)
                    admin = caller_is_admin(scope)
                    await run_in_threadpool(
                        bind_start, self.state, scenario, wanted.strip(), admin
                    )
                except ReefError as error:
                    await refuse(send, error, scope)
                    return
        await self.app(scope, receive, send)


def bind_start(state: ServerState, scenario: str, wanted: str, admin: bool = True) -> None:
    """Create `scenario` from `wanted` if it is new, or check that it started from `wanted`
    (blocking: the store, and git for a new scenario's first release). Starting a scenario
    on a release makes that release serve: only an `admin` caller may."""
    chain, scenarios = state.workflow.chain, state.scenarios
    with scenarios.lock:
        head = chain.head(scenario)
        started = scenarios.start_release(scenario)
        if head is None and scenario not in scenarios.created:
            if wanted != BASE_RELEASE:
                if not admin:
                    raise Forbidden(start_needs_admin(scenario, wanted))
                chain.get(wanted)  # a 404 naming an unknown release
                reason = f"scenario created by a call's {HEADER}"
                head = chain.promote(wanted, scenario, reason, expected_head=None)
                state.serving.swap(scenario, state.workflow.binding(head))
            scenarios.create(scenario, wanted if wanted != BASE_RELEASE else None)
            return
        bound = started or BASE_RELEASE
        if wanted != bound:
            raise Conflict(
                f"scenario {scenario!r} started from {bound}, and {HEADER} names {wanted}: drop "
                f"the header, send {bound}, or name a new scenario to start one from {wanted}",
                code="start_release_mismatch",
            )


def start_needs_admin(scenario: str, release_id: str) -> str:
    """Why a caller without the admin token cannot start `scenario` on `release_id`."""
    return (
        f"starting scenario {scenario!r} on {release_id} makes that release serve, which needs "
        "an admin token: send the value of REEF_ADMIN_TOKEN, or start it from the model alone"
    )
