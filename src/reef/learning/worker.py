"""The learning worker: asks each scenario's recipes for candidates and puts each through the gate.

`reef serve` runs it in a separate process, so learning never blocks serving (it only competes
for CPU). Each learning scenario has its own lane, and the lanes run side by side: a slow step on
one scenario (a LoRA training for minutes) never holds up another. Within a lane the scenario's
recipes step in turn (`scenarios.<name>.learning.recipes`), each proposing against the current
head.

A step: build the scenario's experience view for the recipe (the records no candidate of that
recipe holds), ask it for a batch and a proposal, store the proposal as a candidate that records
what it consumed (a proposal of one part keeps the other part that serves: the whole agent
evolves), gate it, and record the step's outcome. A recipe or gate error, or a candidate the gate
could not judge, is logged and retried after a growing pause; it never stops the worker or the
server.

Modes (per scenario): `auto` steps whenever a recipe says a batch is ready; `manual` steps only
for instructions queued with `reef train` (`POST /reef/train`), each taken by the recipe whose
turn it is; `hybrid` does both.

Several workers may share one store (replicas of `reef serve`, a `reef learn`): the loop steps a
scenario only while it holds the scenario's lease (`reef.store.leases`), so exactly one learns
on each; a worker that dies loses its leases within `learning.lease_s`, and another takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reef.artifacts import keep_serving_parts
from reef.config import EpisodeGateConfig, ReefConfig
from reef.engines import resolve_kind, served_model_path
from reef.episodes.gate import EPISODE_TASK_PREFIX
from reef.evaluation.held_out import among, prompt_key, task_prompt
from reef.evaluation.runner import Generate, TaskResult, model_generate
from reef.evaluation.tasks import EvalTask
from reef.inference.binding import Binding
from reef.inference.model import Model
from reef.learning.leases import LeaseKeeper
from reef.learning.plans import LoadedPlan, load_plans
from reef.learning.services import RecipeServices
from reef.learning.trackers import track_candidate
from reef.protocol import ChatRequest
from reef.releases.chain import read_folder
from reef.releases.workflow import ReleaseWorkflow
from reef.sdk.recipe import Evaluated, Proposal, ProposalRefused, Recipe, StepContext
from reef.sdk.view import ExperienceView, Trajectory
from reef.store import ExperienceStore
from reef.store.candidates import AGENT_SOURCE, Candidate
from reef.store.learning import (
    fingerprint,
    save_annotation,
    save_counts,
    save_step,
    spend_records,
    spent_record_ids,
    take_request,
)
from reef.store.scenarios import selected_training_mode
from reef.tracing import set_on, traced

log = logging.getLogger("reef.learning")
MAX_BACKOFF_S = 300.0


@dataclass
class StepResult:
    scenario: str
    outcome: str  # waiting, no proposal, released, rejected, held, error
    detail: str = ""
    candidate_id: str | None = None
    recipe: str = ""
    # The step could not be judged (a recipe error, a gate that could not run or finish):
    # the learner pauses before trying again.
    retry_later: bool = False
    metric_calls: int = 0  # answers the step asked for to score (`MetricCalls`)
    learned_from: int = 0  # the calls its candidate was built from
    # What became of the signal: learned from, held out, dropped by reason (`signal_of`).
    signal: dict[str, Any] = field(default_factory=dict)


def not_ready(recipe: Recipe, view: ExperienceView) -> tuple[str, bool]:
    """Why a recipe does not step: what its batch still lacks (sdft needs a demonstration or a
    hint on each turn, sdpo a correct sibling; `Recipe.waiting_for`) and what never reaches it
    (the calls held out for the gate, those with private data), and whether that is worth a
    log line: enough records wait for a batch, yet none is one. A batch still filling up is
    not."""
    waiting = view.counts.waiting
    kept_out = [
        f"{count} {what}"
        for count, what in (
            (view.counts.held_out, "held out for the gate"),
            (view.counts.private, "kept out for private data"),
        )
        if count
    ]
    if not waiting and not kept_out:
        return "0 record(s) waiting", False
    size = recipe.settings.batch_size
    lacks = recipe.waiting_for(view)
    wanted = f": {lacks}" if lacks else f" (batch_size {size})"
    why = f"{waiting} record(s) waiting, not yet a batch {recipe.name} can learn from{wanted}"
    if kept_out:
        why += f"; {', '.join(kept_out)}"
    return why, waiting >= size


class MetricCalls:
    """The answers one step asks the served model for, to score them: its recipe's search
    (`generate`, `generate_under`, or an episode under a tree it tries) and its gate's
    evaluation (an answer, or an episode). The budget recipes are compared on, as GEPA counts
    its metric calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()  # a recipe may answer from several threads

    def _one(self) -> None:
        with self._lock:
            self.calls += 1

    def count_in(self, context: StepContext) -> None:
        """Count every answer the recipe asks `context` for, and every episode it runs under a
        tree it tries (one metric call an episode: `run_episodes_under` runs one per task and
        repeat)."""
        if context.generate is not None:
            context.generate = self._counting(context.generate)
        if context.generate_under is not None:
            context.generate_under = self._counting(context.generate_under)
        if context.run_episodes_under is not None:
            context.run_episodes_under = self._counting_episodes(context.run_episodes_under)

    def _counting_episodes(
        self, run: Callable[..., list[dict[str, Any]]]
    ) -> Callable[..., list[dict[str, Any]]]:
        def counted(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            episodes = run(*args, **kwargs)
            with self._lock:
                self.calls += len(episodes)
            return episodes

        return counted

    def _counting(self, answer: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._one()
            return answer(*args, **kwargs)

        return counted

    def counting_gate_episodes(
        self, episodes: EpisodeGateConfig | None
    ) -> Callable[[TaskResult], None] | None:
        """The gate's `on_task`, counting an episode gate's episodes: `repeats` on each side of
        each task it ran (its chat answers are counted by `counting_gate`)."""
        if episodes is None:
            return None
        per_task = 2 * episodes.repeats

        def counted(result: TaskResult) -> None:
            if result.task_id.startswith(EPISODE_TASK_PREFIX):
                with self._lock:
                    self.calls += per_task

        return counted

    def counting_gate(self, generate: Generate) -> Generate:
        """`generate` for the gate, counted."""

        async def counted(request: ChatRequest, binding: Binding) -> str:
            self._one()
            return await generate(request, binding)

        return counted


@dataclass
class Learner:
    """One recipe learning on one scenario, and what it remembers between steps."""

    scenario: str
    recipe: Recipe
    idle_at: tuple[Any, ...] | None = None  # the experience when it last waited or proposed nothing
    backoff_s: float = 0.0
    retry_at: float = 0.0  # time.monotonic() before which it is not stepped

    def pause_after(self, result: StepResult, interval: float) -> None:
        if result.retry_later:
            self.backoff_s = min(MAX_BACKOFF_S, 2 * (self.backoff_s or interval))
            self.retry_at = time.monotonic() + self.backoff_s
        else:
            self.backoff_s = 0.0


@dataclass
class Lane:
    """A scenario's learners, stepped in turn."""

    scenario: str
    mode: str
    learners: list[Learner] = field(default_factory=list)
    turn: int = 0

    def next_learner(self) -> Learner:
        learner = self.learners[self.turn % len(self.learners)]
        self.turn += 1
        return learner


class LearningWorker:
    def __init__(
        self,
        config: ReefConfig,
        store: ExperienceStore,
        model: Model,
        progress: Callable[[str, int, int, float | None], None] | None = None,
        plans: list[LoadedPlan] | None = None,
    ) -> None:
        """Learn on every scenario `config` names (`load_plans`), or on `plans` alone."""
        self.config = config
        self.store = store
        self.model = model  # the server's engine over loopback, or one loaded here
        self.progress = progress  # where a recipe's long work reports (a CLI progress bar)
        self.workflow = ReleaseWorkflow(config, store)
        chosen = load_plans(config) if plans is None else plans
        self.lanes = {plan.scenario: _lane(plan) for plan in chosen}
        self.leases = LeaseKeeper(store, config.learning.lease_s)
        self.services = RecipeServices(config, model)  # what a step may call on Reef

    # -- one step -----------------------------------------------------------------------------

    def view(self, scenario: str, recipe: Recipe | None = None) -> ExperienceView:
        """The scenario's experience as `recipe` (default: the scenario's first) sees it."""
        recipe = recipe or self.lanes[scenario].learners[0].recipe
        head = self.workflow.chain.head(scenario)
        gate = self.config.gate_for(scenario)
        view = ExperienceView(
            self.store,
            scenario,
            consumed=self.workflow.candidates.consumed_record_ids(scenario, source=recipe.name)
            | spent_record_ids(self.store, scenario, recipe.name),
            head_number=head.number if head else 0,
            max_staleness=recipe.settings.max_staleness,
            # Good answers are held back for the gate's replay, and a share of the failing
            # calls held out for its feedback tasks, only where a gate evaluates: under
            # `always` nothing judges on them, and a recipe would lose them for nothing.
            hold_back_at=gate.replay_threshold if gate.policy != "always" else None,
            hold_back=gate.replay > 0,
            hold_out=gate.held_out,
            hold_out_seed=gate.seed,
        )
        counts = view.counts
        save_counts(self.store, scenario, counts.waiting, counts.consumed, counts.stale_skipped)
        return view

    async def step(
        self, scenario: str, instruction: str | None = None, force: bool = False
    ) -> StepResult:
        """One step of the scenario's recipe whose turn it is; without an instruction (or
        `force`) only when that recipe says it is ready."""
        learner = self.lanes[scenario].next_learner()
        return await self.step_learner(learner, instruction, force)

    async def step_learner(
        self,
        learner: Learner,
        instruction: str | None = None,
        force: bool = False,
        provenance: dict[str, Any] | None = None,
    ) -> StepResult:
        """One step of `learner`; `provenance`: where its instruction came from (`POST
        /reef/train`'s id, session, release_id, requires), kept on the candidate's metrics as
        `training_request`."""
        self.services.loop = asyncio.get_running_loop()
        scenario, recipe = learner.scenario, learner.recipe
        proposed = await asyncio.to_thread(self._agent_proposal, scenario)
        if proposed is not None:  # an agent's proposal waits: it is gated before the recipe asks
            return await self._gate_agent_proposal(proposed)
        automatic = instruction is None and not force
        seen = await asyncio.to_thread(self._fingerprint, scenario)
        if automatic and recipe.waits_for_traffic and learner.idle_at == seen:
            # Nothing new since the recipe last waited or proposed nothing: don't rebuild the
            # view (it reads every record) or ask the proposer the same question again.
            return StepResult(scenario, "waiting", "no new experience", recipe=recipe.name)
        view = await asyncio.to_thread(self.view, scenario, recipe)
        if automatic and not recipe.ready(view):
            learner.idle_at = seen
            waiting, stuck = not_ready(recipe, view)
            if stuck:  # said once per new experience: the fingerprint gates this branch
                log.info("%s: %s", scenario, waiting)
            return StepResult(scenario, "waiting", waiting, recipe=recipe.name)
        learner.idle_at = None
        started = time.time()
        fence = self.leases.fence(scenario)  # the lease's generation as the step begins
        tally = MetricCalls()
        dropped: Counter[str] = Counter()
        try:
            attributes = {"reef.scenario": scenario, "reef.recipe": recipe.name}
            with traced(self.workflow.tracing, "reef.learning.step", **attributes) as span:
                result = await self._propose_and_gate(
                    learner, view, instruction, tally, fence, provenance, dropped
                )
                set_on(
                    span,
                    **{"reef.outcome": result.outcome, "reef.candidate.id": result.candidate_id},
                )
        except ProposalRefused as refused:
            result = StepResult(scenario, "no proposal", str(refused))
            log.info("learning step for %s proposed nothing: %s", scenario, refused)
        except Exception as error:
            detail = f"{type(error).__name__}: {error}"
            result = StepResult(scenario, "error", detail, retry_later=True)
            log.warning("learning step of %s on %s failed: %s", recipe.name, scenario, detail)
        result.recipe = recipe.name
        result.metric_calls = tally.calls
        result.signal = signal_of(view, dropped, result.learned_from)
        if automatic and result.outcome == "no proposal":
            learner.idle_at = seen
        await asyncio.to_thread(self._save_step, result, started, instruction)
        return result

    async def _spend_dropped(
        self,
        scenario: str,
        recipe: Recipe,
        batch: list[Trajectory],
        context: StepContext,
        learned_from: list[str],
    ) -> None:
        """Where the step dropped turns (content check, no answer met the feedback, ...), the
        batch's records it did not learn from are spent for this recipe: its next steps take the
        next ones, and each call's drop is counted once, until a new report on it. A step that
        dropped nothing (a refusal for its settings, a proposer's garbage) spends nothing."""
        if not context.dropped:
            return
        tried = {record_id for trajectory in batch for record_id in trajectory.record_ids}
        spent = tried - set(learned_from)
        await asyncio.to_thread(spend_records, self.store, scenario, recipe.name, spent)

    def _agent_proposal(self, scenario: str) -> Candidate | None:
        """The oldest candidate an agent proposed (`POST /reef/harness/proposals`) still waiting
        for its gate; None while a canary runs (a gate would end it unjudged)."""
        candidates = self.workflow.candidates
        if candidates.list(scenario, "canary"):
            return None
        waiting = [c for c in candidates.list(scenario, "proposed") if c.source == AGENT_SOURCE]
        return waiting[-1] if waiting else None  # the list is newest first

    async def _gate_agent_proposal(self, candidate: Candidate) -> StepResult:
        started, scenario = time.time(), candidate.scenario
        generate = model_generate(self.model, self.workflow.eval_settings(scenario))
        gated = await self.workflow.gate(candidate, generate, fence=self.leases.fence(scenario))
        log.info(
            "%s: an agent's proposal %s %s: %s", scenario, gated.id, gated.state, gated.decision
        )
        result = StepResult(
            scenario, gated.state, gated.decision or "", gated.id, retry_later=gated.unjudged
        )
        result.recipe = AGENT_SOURCE
        await asyncio.to_thread(self._save_step, result, started, None)
        return result

    def _fingerprint(self, scenario: str) -> tuple[Any, ...]:
        """Changes whenever the scenario gets a record, a report, a candidate or a release."""
        return (
            *fingerprint(self.store, scenario),
            self.workflow.chain.head_commits().get(scenario),
        )

    async def _propose_and_gate(
        self,
        learner: Learner,
        view: ExperienceView,
        instruction: str | None,
        tally: MetricCalls,
        fence: Callable[[], None] | None = None,
        provenance: dict[str, Any] | None = None,
        dropped: Counter[str] | None = None,
    ) -> StepResult:
        scenario, recipe = learner.scenario, learner.recipe
        if await asyncio.to_thread(self.workflow.candidates.list, scenario, "canary"):
            # Live traffic is judging a candidate: a new one would end its canary unjudged.
            return StepResult(scenario, "no proposal", "a canary is running on this scenario")
        batch = recipe.build_batch(view)
        context = await asyncio.to_thread(self._context, scenario, recipe, instruction)
        context.anchors = anchors(view, batch)
        if dropped is not None:
            context.dropped = dropped
        tally.count_in(context)
        try:
            proposal = await asyncio.to_thread(recipe.propose, batch, context)
        except ProposalRefused:
            await self._spend_dropped(scenario, recipe, batch, context, [])
            raise
        await self._spend_dropped(
            scenario, recipe, batch, context, proposal.consumed_record_ids if proposal else []
        )
        if proposal is None:
            return StepResult(scenario, "no proposal", "the recipe proposed nothing")
        kind, files = keep_serving_parts(proposal.kind, proposal.files, context.files)
        # In a thread: it writes the candidate's files (an adapter's megabytes) and its row,
        # and the other scenarios' lanes share this loop.
        candidate = await asyncio.to_thread(
            self.workflow.propose,
            scenario,
            kind,
            files,
            source=recipe.name,
            reason=proposal.reason,
            consumed_record_ids=proposal.consumed_record_ids,
            metrics={**proposal.metrics, "training_request": provenance}
            if provenance
            else proposal.metrics or None,
        )
        generate = model_generate(self.model, self.workflow.eval_settings(scenario))
        gated = await self.workflow.gate(
            candidate,
            tally.counting_gate(generate),
            on_task=tally.counting_gate_episodes(self.config.gate_for(scenario).episodes),
            extra_tasks=self._judged_on(recipe, view, batch, proposal),
            fence=fence,
        )
        log.info("%s: candidate %s %s: %s", scenario, gated.id, gated.state, gated.decision)
        await asyncio.to_thread(self._track, recipe, candidate, gated)
        return StepResult(
            scenario,
            gated.state,
            gated.decision or "",
            gated.id,
            retry_later=gated.unjudged,
            learned_from=len(set(proposal.consumed_record_ids)),
        )

    def _judged_on(
        self, recipe: Recipe, view: ExperienceView, batch: list[Trajectory], proposal: Proposal
    ) -> list[EvalTask]:
        """The gate's tasks beside the scenario's: the proposal's own, but never one whose
        prompt the step learned from (a recipe that judges itself on its training prompts
        passes by remembering them), and the held-out calls' (`Recipe.held_out_tasks`), the
        newest `gate.held_out_tasks`."""
        learned = {prompt_key(turn.prompt) for t in batch for turn in t.turns}
        own = [t for t in proposal.eval_tasks if not among(prompt_key(task_prompt(t)), learned)]
        if len(own) < len(proposal.eval_tasks):
            log.info(
                "%s: %d of %s's gate task(s) dropped: it learned from their prompts",
                view.scenario,
                len(proposal.eval_tasks) - len(own),
                recipe.name,
            )
        newest = self.config.gate_for(view.scenario).held_out_tasks
        held = recipe.held_out_tasks(view.held_out)[-newest:] if newest else []
        return [*own, *(t for t in held if not among(prompt_key(task_prompt(t)), learned))]

    def _track(self, recipe: Recipe, proposed: Candidate, gated: Candidate) -> None:
        """The candidate's curves and its gate's decision, to `learning.trackers`."""
        try:
            track_candidate(
                self.config.learning.trackers,
                self.config.state_dir,
                gated.scenario,
                recipe.name,
                gated.id,
                proposed.metrics,
                gated.state,
                gated.decision,
                gated.evaluation,
            )
        except Exception as error:  # curves are a convenience: the step stands without them
            log.warning("could not write the curves of %s: %s", gated.id, error)

    def _context(self, scenario: str, recipe: Recipe, instruction: str | None) -> StepContext:
        head = self.workflow.chain.head(scenario)
        files = self.workflow.chain.files(head.release_id) if head else {}
        candidates = self.workflow.candidates.list(scenario)
        rejected = [c for c in candidates if c.state == "rejected"][:5]
        serving = self.workflow.binding(head)
        gate_episodes = self.config.gate_for(scenario).episodes
        services = self.services
        services.forget_old_trials()
        return StepContext(
            scenario=scenario,
            release_id=head.release_id if head else "base",
            files=files,
            recent_rejections=[f"{c.reason}: {c.decision}" for c in rejected],
            instruction=instruction,
            ask=services.ask,
            evaluated=[e for c in candidates[:20] if (e := _evaluated(c)) is not None],
            proposer_context_tokens=self._proposer_context(),
            generate=functools.partial(services.generate, binding=serving),
            generate_under=functools.partial(services.generate_under, serving=serving),
            run_episodes=functools.partial(services.run_episodes, scenario),
            run_episodes_under=functools.partial(services.run_episodes_under, scenario),
            episode_suite=gate_episodes.tasks if gate_episodes else None,
            model_path=served_model_path(self.config.engine),
            work_dir=self.config.state_dir / "learning" / recipe.name,
            progress=self.progress,
            annotate=functools.partial(save_annotation, self.store, scenario, recipe.name),
        )

    def _proposer_context(self) -> int | None:
        """The proposer's context window where Reef knows it: the served llama.cpp model's."""
        if self.config.learning.proposer_url:
            return None
        kind, _ = resolve_kind(self.config.engine)
        return self.config.engine.llamacpp.n_ctx if kind == "llamacpp" else None

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Step every scenario's recipes until `stop`, each scenario in its own lane, while
        this worker holds the scenario's lease."""
        lanes = [self._run_lane(lane, stop) for lane in self.lanes.values()]
        try:
            await asyncio.gather(self.leases.keep(self.lanes, stop), *lanes)
        finally:
            await asyncio.shield(asyncio.to_thread(self.leases.give_up))

    def leads(self, scenario: str) -> bool:
        """Whether this worker holds the scenario's lease now (for sure)."""
        return self.leases.leads(scenario)

    @property
    def leading(self) -> set[str]:
        """The scenarios this worker learns on now."""
        return {scenario for scenario in self.lanes if self.leads(scenario)}

    async def _run_lane(self, lane: Lane, stop: asyncio.Event) -> None:
        interval = self.config.learning.interval_s
        while not stop.is_set():
            for _ in lane.learners:
                if not self.leads(lane.scenario):
                    break  # another worker learns on it
                learner = lane.next_learner()
                if stop.is_set() or time.monotonic() < learner.retry_at:
                    continue
                result = await self._next_step(lane, learner)
                if result is not None:
                    learner.pause_after(result, interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def next_step(self, scenario: str) -> StepResult | None:
        """What the loop does for the scenario's next recipe: a step for a queued instruction
        (manual, hybrid), an automatic step (auto, hybrid), or nothing."""
        lane = self.lanes[scenario]
        return await self._next_step(lane, lane.next_learner())

    async def _next_step(self, lane: Lane, learner: Learner) -> StepResult | None:
        mode = await asyncio.to_thread(self.training_mode, lane)
        if mode in ("manual", "hybrid"):
            request = await asyncio.to_thread(take_request, self.store, lane.scenario)
            if request is not None:
                return await self.step_learner(learner, request.text, provenance=request.provenance)
        if mode in ("auto", "hybrid"):
            return await self.step_learner(learner)
        return None

    def training_mode(self, lane: Lane) -> str:
        """The lane's mode: the one selected at runtime (`POST /reef/scenarios/{s}/update`, on
        any replica: the store holds it), else the configured one."""
        try:
            return selected_training_mode(self.store, lane.scenario) or lane.mode
        except Exception as error:  # the store is away: the configured mode meanwhile
            log.warning("could not read the training mode of %s: %s", lane.scenario, error)
            return lane.mode

    # -- bookkeeping in experience.db ----------------------------------------------------------

    def _save_step(self, result: StepResult, started: float, instruction: str | None) -> None:
        row = {
            "scenario": result.scenario,
            "recipe": result.recipe,
            "started_at": started,
            "finished_at": time.time(),
            "outcome": result.outcome,
            "error": result.detail if result.outcome == "error" else None,
            "candidate_id": result.candidate_id,
            "instruction": instruction,
            "metric_calls": result.metric_calls,
            "detail": result.detail or None,
            "signal": json.dumps(result.signal) if result.signal else None,
        }
        save_step(self.store, row)


ANCHORS = 16  # questions outside the batch a step offers its recipe


def signal_of(view: ExperienceView, dropped: Counter[str], learned_from: int) -> dict[str, Any]:
    """What became of a step's signal: the calls its candidate learned from, those held out for
    the gate, and those dropped, by reason (stale, private data, and what its recipe could not
    learn from)."""
    reasons = dict(dropped)
    if view.counts.stale_skipped:
        reasons["stale"] = view.counts.stale_skipped
    if view.counts.private:
        reasons["private data"] = view.counts.private
    return {"learned_from": learned_from, "held_out": view.counts.held_out, "dropped": reasons}


def _lane(plan: LoadedPlan) -> Lane:
    learners = [Learner(plan.scenario, recipe) for recipe in plan.recipes]
    return Lane(plan.scenario, plan.mode, learners)


def anchors(view: ExperienceView, batch: list[Trajectory]) -> list[list[dict[str, Any]]]:
    """The messages of the view's latest single-turn calls outside `batch`, newest first."""
    taken = {turn.record_id for trajectory in batch for turn in trajectory.turns}
    others = [
        t.turns[0].messages
        for t in reversed(view.trajectories)
        if len(t.turns) == 1 and t.turns[0].record_id not in taken
    ]
    return others[:ANCHORS]


def _evaluated(candidate: Candidate) -> Evaluated | None:
    results = (candidate.evaluation or {}).get("results")
    if not results or not candidate.folder.is_dir():
        return None
    return Evaluated(
        candidate_id=candidate.id,
        files=read_folder(candidate.folder),
        scores={r["task_id"]: float(r["candidate_score"]) for r in results},
    )
