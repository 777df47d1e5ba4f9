"""What every route shares: the config, the engine, the store, and per-call context from headers
(`reef.server.call`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from reef.config import ReefConfig
from reef.engines.base import Engine
from reef.episodes.tokens import candidate_of, trial_of
from reef.errors import BadRequest, Forbidden, NotFound
from reef.inference.binding import Binding, binding_for
from reef.inference.server_file import new_internal_token
from reef.inference.trials import UnknownTrial, trial_binding
from reef.releases.canary import Verdict
from reef.releases.workflow import ReleaseWorkflow
from reef.scenario import DEFAULT_SCENARIO, RuntimeScenarios, check_scenario
from reef.server.call import CallContext, tags_of
from reef.server.in_flight import InFlight
from reef.server.metrics import ServingMetrics
from reef.server.serving_now import ServingNow
from reef.server.teacher import Teacher
from reef.store import ExperienceStore
from reef.tracing import Tracing, caller_trace_id


class Shadows(Protocol):
    """What the state asks of its shadow runner (`reef.daemon.shadow.ShadowRunner`,
    which reads the state, so the state knows it only by this)."""

    def offer(self, scenario: str, record_id: str) -> None: ...

    def status(self) -> dict[str, Any]: ...


@dataclass
class ServerState:
    config: ReefConfig
    engine: Engine
    store: ExperienceStore
    workflow: ReleaseWorkflow
    engine_reason: str = ""
    # Lets Reef's own processes (the learning worker, `reef release publish`) use the engine.
    internal_token: str = field(default_factory=new_internal_token, repr=False)
    # What each scenario serves now, and why a head could not: one snapshot and its one
    # writer (`reef.server.serving_now`).
    serving: ServingNow = field(default_factory=ServingNow)
    # Scenarios whose release answers its own gate tasks otherwise than the gate judged after
    # its swap (`reef.daemon.release_probe`): scenario -> what the probe found; replaced whole.
    release_mismatch: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The latest verdict of each running canary this server judges (candidate id -> Verdict).
    canaries: dict[str, Verdict] = field(default_factory=dict)
    # Candidates answering copies of live calls, once serving.
    shadows: Shadows | None = None
    # Scenario -> its teacher, started with the server.
    teachers: dict[str, Teacher] = field(default_factory=dict)
    # Scenarios created at runtime and the training modes chosen for them (in the store).
    scenarios: RuntimeScenarios = field(default_factory=RuntimeScenarios)
    # Traces (OpenTelemetry), when on: `reef.tracing.Tracing`.
    tracing: Tracing | None = None
    # Candidate id -> its binding, for the episodes a gate runs under it (`episode_binding`),
    # and trial trees' bindings, for the episodes a recipe's search runs under them.
    episode_bindings: dict[str, Binding] = field(default_factory=dict)

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """What each scenario serves now (`serving`'s snapshot; read-only)."""
        return self.serving.snapshot.bindings

    @property
    def release_errors(self) -> Mapping[str, str]:
        """Why a scenario's head could not be served (`serving`'s snapshot; read-only)."""
        return self.serving.snapshot.errors

    def recorded(self, scenario: str, record_id: str) -> None:
        """A live call's record is stored: its scenario's shadows get a copy."""
        if self.shadows is not None:
            self.shadows.offer(scenario, record_id)

    started_at: float = field(default_factory=time.time)
    in_flight: InFlight = field(default_factory=InFlight)
    # This server's Prometheus registry and what the serving path counts (GET /metrics).
    metrics: ServingMetrics = field(default_factory=ServingMetrics)

    def __post_init__(self) -> None:
        self.metrics.engine = self.engine.name
        if self.scenarios.store is None:  # what every replica and the learning worker read
            self.scenarios = RuntimeScenarios(self.store)

    def call_context(self, headers: Mapping[str, str]) -> CallContext:
        serving = self.serving.snapshot  # read once: the call is served under what it found
        scenario = self.scenarios.require(scenario_from(headers), self.config, serving.bindings)
        session = headers.get("x-reef-session") or None
        if session is not None and len(session) > 256:
            raise BadRequest("x-reef-session must be at most 256 characters")
        capture = headers.get("x-reef-capture", "true").strip().lower() not in ("false", "0", "no")
        binding = serving.binding(scenario)
        route = None
        tree = headers.get("x-reef-episode-tree", "")
        judged, trial = candidate_of(tree), trial_of(tree)
        if judged is not None:  # an episode of a gate, under the candidate it judges
            binding = self.episode_binding(scenario, judged)
        elif trial is not None:  # an episode of a recipe's search, under the tree it tries
            binding = self.trial_episode_binding(trial, binding)
        elif binding.routing is not None:
            arm = binding.routing.choose(headers, session)
            route, binding = (binding.routing.release_id, arm.name), arm.binding
        cap = self.max_tokens_for(scenario)
        return CallContext(
            scenario,
            session,
            capture,
            binding,
            cap,
            route,
            tags=tags_of(headers),
            caller_trace_id=caller_trace_id(headers),
        )

    def episode_binding(self, scenario: str, candidate_id: str) -> Binding:
        """What serves an episode's calls under a candidate of `scenario` while it is judged
        (the header that names it is set from a verified episode grant only, `server.auth`)."""
        try:
            candidate = self.workflow.candidates.get(candidate_id)
        except NotFound:
            message = f"this episode's candidate {candidate_id!r} does not exist"
            raise Forbidden(message, code="episode_candidate") from None
        if candidate.scenario != scenario or candidate.state not in ("proposed", "evaluating"):
            raise Forbidden(
                f"candidate {candidate_id!r} is {candidate.state} in scenario "
                f"{candidate.scenario!r}: an episode runs under a candidate of its own scenario "
                "while it is being judged",
                code="episode_candidate",
            )
        if candidate_id not in self.episode_bindings:
            if len(self.episode_bindings) >= 64:
                self.episode_bindings.clear()
            self.episode_bindings[candidate_id] = binding_for(
                candidate.id, candidate.kind, candidate.folder
            )
        return self.episode_bindings[candidate_id]

    def trial_episode_binding(self, digest: str, serving: Binding) -> Binding:
        """What serves an episode's calls under a trial tree a recipe's search is scoring (the
        tree is written under this state folder by the learning worker, `reef.inference.trials`)
        with the weights the scenario serves now."""
        key = f"trial:{digest}:{serving.release_id}"
        if key not in self.episode_bindings:
            try:
                found = trial_binding(self.config.state_dir, digest, serving)
            except UnknownTrial as error:
                raise Forbidden(f"this episode's {error}", code="episode_trial") from None
            if len(self.episode_bindings) >= 64:
                self.episode_bindings.clear()
            self.episode_bindings[key] = found
        return self.episode_bindings[key]

    def max_tokens_for(self, scenario: str) -> int | None:
        """The most tokens an answer in `scenario` may have on this server's engine."""
        return self.config.generation_for(scenario).max_tokens_on(self.engine.name)


def scenario_from(headers: Mapping[str, str]) -> str:
    try:
        return check_scenario(headers.get("x-reef-scenario") or DEFAULT_SCENARIO)
    except BadRequest as error:
        raise BadRequest(f"x-reef-scenario: {error.message}") from None
