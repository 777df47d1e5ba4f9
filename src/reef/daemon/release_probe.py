"""After every hot-swap, does the release serve as the gate judged it?

The gate answered each task under the candidate with the engine that now serves the release; a
release is a promise that those answers are what users get. So, once a scenario's head has been
swapped in, a few of the release's own gate tasks (`releases.probe_tasks`, the first ones its
evaluation recorded) are answered again through the live path: the engine this server serves
with, under the binding it now serves, with the sampling the gate recorded (its first sample, on
the gate's seed: a seeded draw over the same logits gives the same tokens). Each answer must be
the one the gate recorded. A release whose answers differ (an engine that reads prompts on other
weights without the release's adapter, an adapter loaded from the wrong file, a harness
applied twice) is flagged: `release_mismatch` in `/reef/status` and `reef status`,
`reef:release_mismatch` in `/metrics`, and the swap logged as suspect. It still serves: the
probe says what serves is not what was judged, it does not choose what to serve.

Only what can be replayed is probed: tasks whose messages are known again (the scenario's eval
files, and the tasks the gate had beside them, kept with the evaluation), on a release without
a routing policy (its arms answer by session), whose evaluation recorded its sampling, on an
engine whose answers do not depend on what runs beside them (`REPLAYABLE_ENGINES`: llama.cpp
reads every prompt in the same shapes, slots.py, and seeds each sequence's draw; vLLM and a
remote API batch as they like, and a probe there would flag their noise).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from reef.evaluation.runner import EvalSettings, model_generate, task_request
from reef.evaluation.tasks import EvalTask, task_hash
from reef.inference.binding import Binding
from reef.inference.model import LocalModel
from reef.releases.chain import Release
from reef.releases.workflow import gate_tasks_of_evaluation
from reef.server.state import ServerState

log = logging.getLogger("reef.releases")
REPLAYABLE_ENGINES = frozenset({"llamacpp", "scripted"})


@dataclass
class ProbeResult:
    """What the probe of one release found."""

    release_id: str
    probed: int
    mismatched: list[dict[str, str]] = field(default_factory=list)  # task, judged, served

    @property
    def matches(self) -> bool:
        return not self.mismatched

    def to_json(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "probed": self.probed,
            "mismatched": len(self.mismatched),
            "examples": self.mismatched[:3],
        }


def probe_plan(
    state: ServerState, release: Release, binding: Binding
) -> list[tuple[EvalTask, str]] | None:
    """The tasks to answer again and the answer the gate recorded for each, or None when the
    release cannot be probed (blocking: reads the eval files)."""
    count = state.config.releases.probe_tasks
    evaluation = release.evaluation or {}
    if count == 0 or binding.routing is not None or recorded_sampling(evaluation) is None:
        return None
    if state.engine.name not in REPLAYABLE_ENGINES:
        return None
    recorded = {
        str(result.get("task_hash")): str(result.get("candidate_answer", ""))
        for result in evaluation.get("results") or []
        if isinstance(result, dict) and result.get("task_hash")
    }
    if not recorded:
        return None
    try:
        known = state.workflow.evaluation.tasks(
            release.scenario, gate_tasks_of_evaluation(evaluation)
        )
    except Exception as error:  # the eval files moved on: nothing to replay, nothing flagged
        log.info("release %s: no gate task to probe (%s)", release.release_id, error)
        return None
    plan = [(task, recorded[task_hash(task)]) for task in known if task_hash(task) in recorded]
    return plan[:count] or None


def recorded_sampling(evaluation: dict[str, Any]) -> EvalSettings | None:
    """The sampling of the gate's first answer to each task, as its evaluation recorded it."""
    sampling = evaluation.get("sampling")
    if not isinstance(sampling, dict):
        return None  # evaluated before the gate recorded it: nothing to replay exactly
    try:
        return EvalSettings(
            temperature=sampling["temperature"],
            seed=int(sampling["seed"]),
            max_tokens=int(sampling["max_tokens"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


async def probe(
    state: ServerState, release: Release, binding: Binding, plan: list[tuple[EvalTask, str]]
) -> ProbeResult:
    """Answer each planned task through the live engine under `binding` and compare."""
    settings = recorded_sampling(release.evaluation or {}) or EvalSettings()
    generate = model_generate(LocalModel(state.engine), settings)
    result = ProbeResult(release.release_id, len(plan))
    for task, judged in plan:
        served = await generate(task_request(task, settings), binding)
        if served != judged:
            result.mismatched.append({"task": task.id, "judged": judged, "served": served})
    return result


def record(state: ServerState, scenario: str, result: ProbeResult) -> None:
    """Keep the probe's verdict for `/reef/status` and `/metrics`; a mismatch is logged."""
    found = {k: v for k, v in state.release_mismatch.items() if k != scenario}
    if not result.probed:  # nothing could be replayed: nothing is claimed either way
        pass
    elif not result.matches:
        found[scenario] = result.to_json()
        example = result.mismatched[0]
        log.warning(
            "scenario %s: the swap to %s is suspect: %d of %d gate task(s) answer otherwise "
            "than the gate judged (%s: judged %r, served %r)",
            scenario,
            result.release_id,
            len(result.mismatched),
            result.probed,
            example["task"],
            example["judged"][:80],
            example["served"][:80],
        )
    else:
        log.info(
            "scenario %s serves %s as judged (%d gate task(s) probed)",
            scenario,
            result.release_id,
            result.probed,
        )
    state.release_mismatch = found
