"""The learning worker: asks the recipe for candidates and puts each through the gate.

`reef serve` runs it in a separate process, so learning never blocks serving (it only competes
for CPU). A step: build the scenario's experience view, ask the recipe for a batch and a proposal,
store the proposal as a candidate that records what it consumed, gate it, and record the step's
outcome. A recipe or gate error is logged, counted, and retried after a growing pause; it never
stops the worker or the server.

Modes: `auto` steps whenever the recipe says a batch is ready; `manual` steps only for
instructions queued with `reef train` (`POST /reef/train`); `hybrid` does both.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from reef.config import ReefConfig
from reef.engines import served_model_path
from reef.evaluation.runner import model_generate
from reef.inference.binding import Binding
from reef.inference.model import Model, answer_text
from reef.learning.recipe import Evaluated, ProposalRefused, Recipe, StepContext
from reef.learning.view import ExperienceView, Trajectory
from reef.protocol import ChatRequest, Completion
from reef.releases.chain import read_folder
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.store.candidates import Candidate
from reef.store.learning import (
    fingerprint,
    save_annotation,
    save_counts,
    save_step,
    take_instruction,
)

log = logging.getLogger("reef.learning")
MAX_BACKOFF_S = 300.0


@dataclass
class StepResult:
    scenario: str
    outcome: str  # waiting, no proposal, released, rejected, held, error
    detail: str = ""
    candidate_id: str | None = None


class LearningWorker:
    def __init__(
        self,
        config: ReefConfig,
        store: ExperienceStore,
        recipe: Recipe,
        model: Model,
        progress: Callable[[str, int, int, float | None], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.recipe = recipe
        self.model = model  # the server's engine over loopback, or one loaded here
        self.progress = progress  # where a recipe's long work reports (a CLI progress bar)
        self.workflow = ReleaseWorkflow(config, store)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[str, tuple[Any, ...]] = {}  # scenario -> experience when it last idled

    # -- one step -----------------------------------------------------------------------------

    def view(self, scenario: str) -> ExperienceView:
        head = self.workflow.chain.head(scenario)
        gate = self.config.gate_for(scenario)
        view = ExperienceView(
            self.store,
            scenario,
            consumed=self.workflow.candidates.consumed_record_ids(scenario),
            head_number=head.number if head else 0,
            max_staleness=self.recipe.settings.max_staleness,
            hold_back_at=gate.replay_threshold if gate.replay else None,
        )
        counts = view.counts
        save_counts(self.store, scenario, counts.waiting, counts.consumed, counts.stale_skipped)
        return view

    async def step(
        self, scenario: str, instruction: str | None = None, force: bool = False
    ) -> StepResult:
        """One step; without an instruction (or `force`) only when the recipe says it is ready."""
        self._loop = asyncio.get_running_loop()
        automatic = instruction is None and not force
        seen = await asyncio.to_thread(self._fingerprint, scenario)
        if automatic and self.recipe.waits_for_traffic and self._idle.get(scenario) == seen:
            # Nothing new since the recipe last waited or proposed nothing: don't rebuild the
            # view (it reads every record) or ask the proposer the same question again.
            return StepResult(scenario, "waiting", "no new experience")
        view = await asyncio.to_thread(self.view, scenario)
        if automatic and not self.recipe.ready(view):
            self._idle[scenario] = seen
            return StepResult(scenario, "waiting", f"{view.counts.waiting} record(s) waiting")
        self._idle.pop(scenario, None)
        started = time.time()
        try:
            result = await self._propose_and_gate(scenario, view, instruction)
        except ProposalRefused as refused:
            result = StepResult(scenario, "no proposal", str(refused))
            log.info("learning step for %s proposed nothing: %s", scenario, refused)
        except Exception as error:
            result = StepResult(scenario, "error", f"{type(error).__name__}: {error}")
            log.warning("learning step for %s failed: %s", scenario, result.detail)
        if automatic and result.outcome == "no proposal":
            self._idle[scenario] = seen
        self._save_step(result, started, instruction)
        return result

    def _fingerprint(self, scenario: str) -> tuple[Any, ...]:
        """Changes whenever the scenario gets a record, a report, a candidate or a release."""
        return (
            *fingerprint(self.store, scenario),
            self.workflow.chain.head_commits().get(scenario),
        )

    async def _propose_and_gate(
        self, scenario: str, view: ExperienceView, instruction: str | None
    ) -> StepResult:
        batch = self.recipe.build_batch(view)
        context = await asyncio.to_thread(self._context, scenario, instruction)
        context.anchors = anchors(view, batch)
        proposal = await asyncio.to_thread(self.recipe.propose, batch, context)
        if proposal is None:
            return StepResult(scenario, "no proposal", "the recipe proposed nothing")
        candidate = self.workflow.propose(
            scenario,
            proposal.kind,
            proposal.files,
            source=self.recipe.name,
            reason=proposal.reason,
            consumed_record_ids=proposal.consumed_record_ids,
            metrics=proposal.metrics or None,
        )
        generate = model_generate(self.model, self.workflow.eval_settings(scenario))
        gated = await self.workflow.gate(candidate, generate, extra_tasks=proposal.eval_tasks)
        log.info("%s: candidate %s %s: %s", scenario, gated.id, gated.state, gated.decision)
        return StepResult(scenario, gated.state, gated.decision or "", gated.id)

    def _context(self, scenario: str, instruction: str | None) -> StepContext:
        head = self.workflow.chain.head(scenario)
        files = self.workflow.chain.files(head.release_id) if head else {}
        candidates = self.workflow.candidates.list(scenario)
        rejected = [c for c in candidates if c.state == "rejected"][:5]
        serving = self.workflow.binding(head)
        return StepContext(
            scenario=scenario,
            release_id=head.release_id if head else "base",
            files=files,
            recent_rejections=[f"{c.reason}: {c.decision}" for c in rejected],
            instruction=instruction,
            ask=self.ask,
            evaluated=[e for c in candidates[:20] if (e := _evaluated(c)) is not None],
            generate=functools.partial(self.generate, binding=serving),
            model_path=served_model_path(self.config.engine),
            work_dir=self.config.state_dir / "learning" / self.recipe.name,
            progress=self.progress,
            annotate=functools.partial(save_annotation, self.store, scenario, self.recipe.name),
        )

    def generate(self, body: dict[str, Any], binding: Binding) -> Completion:
        """A completion from the served model under `binding`, not recorded (called from the
        recipe's thread)."""
        assert self._loop is not None
        request = ChatRequest.model_validate(body)
        running = asyncio.run_coroutine_threadsafe(
            self.model.complete(request, binding), self._loop
        )
        return running.result()

    def ask(
        self,
        messages: list[dict[str, str]],
        json_schema: dict[str, Any] | None = None,
        max_tokens: int = 400,
    ) -> str:
        """The proposer model's reply (called from the recipe's thread). With `json_schema`, the
        reply is constrained to JSON of that schema (a grammar on llama.cpp), so even a small
        model answers with something a recipe can parse, if `max_tokens` leaves it room to
        close: a reply cut short is not JSON."""
        body: dict[str, Any] = {"messages": messages, "temperature": 0.7, "max_tokens": max_tokens}
        if json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": json_schema, "strict": True},
            }
        learning = self.config.learning
        if learning.proposer_url:
            return _ask_endpoint(
                learning.proposer_url,
                learning.proposer_model,
                learning.proposer_api_key_env,
                body,
            )
        assert self._loop is not None
        request = ChatRequest.model_validate(body)
        running = asyncio.run_coroutine_threadsafe(self.model.complete(request), self._loop)
        return answer_text(running.result())

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Step every scenario each interval until `stop`; a failing scenario waits longer."""
        interval = self.config.learning.interval_s
        backoff: dict[str, float] = {}  # scenario -> current pause after errors
        retry_at: dict[str, float] = {}
        while not stop.is_set():
            for scenario in self.config.learning.scenarios:
                if time.monotonic() < retry_at.get(scenario, 0.0):
                    continue
                result = await self._next_step(scenario)
                if result is not None and result.outcome == "error":
                    backoff[scenario] = min(MAX_BACKOFF_S, 2 * backoff.get(scenario, interval))
                    retry_at[scenario] = time.monotonic() + backoff[scenario]
                else:
                    backoff.pop(scenario, None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def _next_step(self, scenario: str) -> StepResult | None:
        mode = self.config.learning.mode
        if mode in ("manual", "hybrid"):
            instruction = take_instruction(self.store, scenario)
            if instruction is not None:
                return await self.step(scenario, instruction)
        if mode in ("auto", "hybrid"):
            return await self.step(scenario)
        return None

    # -- bookkeeping in experience.db ----------------------------------------------------------

    def _save_step(self, result: StepResult, started: float, instruction: str | None) -> None:
        row = {
            "scenario": result.scenario,
            "started_at": started,
            "finished_at": time.time(),
            "outcome": result.outcome,
            "error": result.detail if result.outcome == "error" else None,
            "candidate_id": result.candidate_id,
            "instruction": instruction,
        }
        save_step(self.store, row)


ANCHORS = 16  # questions outside the batch a step offers its recipe


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


def _ask_endpoint(url: str, model: str | None, key_env: str | None, body: dict[str, Any]) -> str:
    headers = {"x-reef-capture": "false"}
    if key_env and os.environ.get(key_env):
        headers["Authorization"] = f"Bearer {os.environ[key_env]}"
    body = {"model": model or "default", **body}
    response = httpx.post(
        f"{url.rstrip('/')}/chat/completions", json=body, headers=headers, timeout=300
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"].get("content") or "")
