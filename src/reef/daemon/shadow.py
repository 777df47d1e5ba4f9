"""Shadows: candidates that answer copies of live calls without being heard.

A candidate put in `shadow` (`reef release shadow`) receives a copy of each recorded chat call
of its scenario: after the live record is stored, its id joins a bounded queue (full: the copy is
dropped, and counted). One worker takes the copies in turn, reads the call back from its record,
applies the candidate's binding, and runs it on the engine only on capacity no live request
uses: on llama.cpp as a background job (a slot only while none is live, stopped at once when a
live request wants it; `LlamaCppEngine.complete(background=True)`), elsewhere only while the
server answers no request. A copy preempted three times, or turned away by a full queue, is
dropped. A checkpoint candidate's copies run only where its weights load beside the served ones
(llama.cpp, whose background work on them yields to live requests on either): on vLLM, which
holds one set of weights, a copy would swap the weights every live request uses, so each is
skipped (and counted). The answer is stored as a
shadow record beside the live one (`reef.store.shadows`), both scored by `gate.shadow.scorer`
when the scenario has one, and never returned to anyone.

With `gate.shadow.base_share` set, the base model shadows that percent of the live calls of a
scenario that serves a release (chosen by record id), its answers stored as shadow records of
the candidate `base` and scored by the scenario's recipe's scorer (else `gate.shadow.scorer`):
the base's pass rate on the very calls each release answered (`reef.evaluation.live`).

Only chat completions calls are copied: a call recorded in another API's shape (Responses,
Messages, text completions) is skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from reef.engines.base import Preempted, Slotted
from reef.errors import Overloaded, ReefError
from reef.evaluation.live import BASE_SHADOW, recipe_scorer
from reef.evaluation.scorers import program_scorer, score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, BASE_RELEASE, Binding, binding_for
from reef.inference.model import answer_text
from reef.protocol import ChatRequest, Completion
from reef.server.state import ServerState
from reef.store.shadows import ShadowRecord, add_shadow

log = logging.getLogger("reef.shadow")
REFRESH_S = 1.0  # how often the shadow candidates are read again
IDLE_POLL_S = 0.05  # how often a copy waiting for an idle engine looks again
ATTEMPTS = 3  # preemptions a copy survives before it is dropped


@dataclass
class Shadowing:
    """One candidate in shadow: what serves it, and what became of its copies."""

    candidate_id: str
    binding: Binding
    counts: dict[str, int] = field(
        default_factory=lambda: {"answered": 0, "preempted": 0, "dropped": 0, "skipped": 0}
    )


class ShadowRunner:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.shadowing: dict[str, list[Shadowing]] = {}  # scenario -> its candidates in shadow
        self.base_shadows: dict[str, Shadowing] = {}  # scenario -> the base answering a share
        # A live call's copy: its scenario, its record, the shadows that answer it.
        self._queue: asyncio.Queue[tuple[str, str, list[Shadowing]]] = asyncio.Queue(
            maxsize=state.config.gate.shadow.queue
        )
        # llama.cpp runs background jobs on idle slots; other engines get a copy while idle.
        # Asked once: a runtime protocol's isinstance reads every property of the engine.
        self._slotted = state.engine if isinstance(state.engine, Slotted) else None
        self._background = self._slotted is not None and self._slotted.runs_background

    def offer(self, scenario: str, record_id: str) -> None:
        """Queue a copy of the live call `record_id` for the scenario's shadows, if it has any
        (the base among them for its share of the calls)."""
        shadows = list(self.shadowing.get(scenario, []))
        if self._base_shadows(scenario, record_id):
            shadows.append(
                self.base_shadows.setdefault(scenario, Shadowing(BASE_SHADOW, BASE_BINDING))
            )
        if not shadows:
            return
        try:
            self._queue.put_nowait((scenario, record_id, shadows))
        except asyncio.QueueFull:  # no idle capacity for a while: this copy is not made
            for shadow in shadows:
                shadow.counts["dropped"] += 1

    def _base_shadows(self, scenario: str, record_id: str) -> bool:
        """Whether the base answers a copy of `record_id`: its scenario serves a release, and
        the record is of the `gate.shadow.base_share` percent chosen by id."""
        share = self.state.config.gate_for(scenario).shadow.base_share
        serving = self.state.bindings.get(scenario)
        if share <= 0 or serving is None or serving.release_id == BASE_RELEASE:
            return False
        return hashlib.sha256(record_id.encode()).digest()[0] * 100 < share * 256

    def status(self) -> dict[str, Any]:
        shadows = [
            (scenario, shadow) for scenario, found in self.shadowing.items() for shadow in found
        ]
        status = {s.candidate_id: {"scenario": scenario, **s.counts} for scenario, s in shadows}
        for scenario, base in self.base_shadows.items():
            status[f"{BASE_SHADOW}:{scenario}"] = {"scenario": scenario, **base.counts}
        return status

    # -- the tasks ------------------------------------------------------------------------------

    async def follow(self) -> None:
        """Read the candidates in shadow again every `REFRESH_S`, and answer the copies."""
        worker = asyncio.create_task(self._answer_copies())
        try:
            while True:
                await asyncio.to_thread(self._refresh)
                await asyncio.sleep(REFRESH_S)
        finally:
            worker.cancel()

    def _refresh(self) -> None:
        try:
            candidates = self.state.workflow.candidates.list(state="shadow")
        except Exception as error:  # the store is away: keep what we had
            log.warning("could not list the shadow candidates: %s", error)
            return
        known = {s.candidate_id: s for shadows in self.shadowing.values() for s in shadows}
        shadowing: dict[str, list[Shadowing]] = {}
        for candidate in candidates:
            shadow = known.get(candidate.id)
            if shadow is None:
                try:
                    binding = binding_for(candidate.id, candidate.kind, candidate.folder)
                except ReefError as error:
                    log.warning("shadow %s cannot serve: %s", candidate.id, error.message)
                    continue
                shadow = Shadowing(candidate.id, binding)
            shadowing.setdefault(candidate.scenario, []).append(shadow)
        self.shadowing = shadowing

    async def _answer_copies(self) -> None:
        while True:
            scenario, record_id, shadows = await self._queue.get()
            for shadow in shadows:
                try:
                    await self._answer(shadow, scenario, record_id)
                except Exception:  # one bad copy never stops the shadows
                    log.exception("shadow %s failed on %s", shadow.candidate_id, record_id)

    async def _answer(self, shadow: Shadowing, scenario: str, record_id: str) -> None:
        record = await asyncio.to_thread(self.state.store.get_record, record_id)
        asked = _chat_request(record)
        if record is None or asked is None or not self._can_run(shadow):
            shadow.counts["skipped"] += 1
            return
        request = shadow.binding.apply(asked).capped(self.state.max_tokens_for(scenario))
        started = time.perf_counter()
        completion = await self._on_idle_capacity(shadow, request)
        if completion is None:
            shadow.counts["dropped"] += 1
            return
        latency_ms = (time.perf_counter() - started) * 1000
        live_score, shadow_score = await asyncio.to_thread(
            self._scores, shadow, scenario, asked, record, completion
        )
        usage = completion.usage or {}
        stored = ShadowRecord(
            scenario=scenario,
            candidate_id=shadow.candidate_id,
            live_record_id=record_id,
            response=completion.response,
            latency_ms=latency_ms,
            completion_tokens=usage.get("completion_tokens"),
            live_score=live_score,
            shadow_score=shadow_score,
        )
        await asyncio.to_thread(add_shadow, self.state.store, stored)
        shadow.counts["answered"] += 1

    async def _on_idle_capacity(self, shadow: Shadowing, request: ChatRequest) -> Completion | None:
        """The shadow's answer, run only when no live request needs the engine; None when it
        was preempted `ATTEMPTS` times."""
        engine, binding = self.state.engine, shadow.binding
        for _ in range(ATTEMPTS):
            while self._busy():
                await asyncio.sleep(IDLE_POLL_S)
            try:
                if self._background:
                    return await engine.complete(  # type: ignore[call-arg]
                        request, binding.adapter, binding.checkpoint, background=True
                    )
                return await engine.complete(request, binding.adapter, binding.checkpoint)
            except (Preempted, Overloaded):
                shadow.counts["preempted"] += 1
        return None

    def _can_run(self, shadow: Shadowing) -> bool:
        """Whether the shadow's copies can run without touching what serves: a checkpoint's
        only where its weights load beside the served ones."""
        if shadow.binding.checkpoint is None:
            return True
        return self.state.engine.capabilities.checkpoints_beside

    def _busy(self) -> bool:
        """Whether a live request is in flight: the engine's count where it keeps one, else the
        server's count of HTTP requests being answered."""
        if self._slotted is not None:
            return self._slotted.in_flight > 0
        return self.state.in_flight.count > 0

    def _scores(
        self,
        shadow: Shadowing,
        scenario: str,
        asked: ChatRequest,
        record: dict[str, Any],
        completion: Completion,
    ) -> tuple[float | None, float | None]:
        """The live answer's score and the shadow's, by `gate.shadow.scorer`; the base's by the
        scenario's recipe's scorer first (what "is it learning?" reads each release by)."""
        config = self.state.config
        spec = config.gate_for(scenario).shadow.scorer
        scorer = program_scorer(ScorerSpec.model_validate(spec)) if spec is not None else None
        if shadow.candidate_id == BASE_SHADOW:
            scorer = recipe_scorer(config, scenario) or scorer
        if scorer is None:
            return None, None
        task = EvalTask(messages=[m.model_dump() for m in asked.messages], scorer=scorer)
        live = answer_text(Completion(response=record["response"], model=""))
        return score(scorer, live, task), score(scorer, answer_text(completion), task)


def _chat_request(record: dict[str, Any] | None) -> ChatRequest | None:
    """The call a record stores, as a chat request to run whole; None for another API's."""
    if record is None:
        return None
    try:
        asked = ChatRequest.model_validate(record["request"])
    except ValidationError:
        return None
    return asked.model_copy(update={"stream": False, "stream_options": None})
