"""Paired evaluation: the current release and a candidate answer the same tasks, same settings.

Both sides get the same messages, sampling settings and seed, so the only difference between
their answers is the artifact. Tasks are sent concurrently (at most `concurrency` requests at a
time, both sides of a task together) so that an engine that batches decodes them together; the
report keeps the tasks' order. Any error (an engine failure, a scorer that raises) propagates and
stops the tasks still running: the gate treats it as a rejection, never as a pass.

A task is lost when the candidate scores below its bar: the current release's score, or the best
score a released release reached on it (`reference_score`, see `reef.evaluation.reference`) when
that is higher. The arms a candidate's routing policy sends sessions to are answered beside the
same current side (`run_beside`), each judged as the candidate is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

from reef.evaluation.scorers import score
from reef.evaluation.tasks import DEFAULT_GROUP, EvalTask, task_hash
from reef.inference.binding import Binding
from reef.inference.model import Model, answer_text
from reef.protocol import ChatRequest, last_user_text

# Produces the answer text for a request under a binding.
Generate = Callable[[ChatRequest, Binding], Awaitable[str]]

# Requests in flight at once when the caller does not say (the gate on llama.cpp passes
# `beside_traffic(slots)`), so that evaluation leaves the queue (server.max_queue) to traffic.
EVAL_CONCURRENCY = 4


def beside_traffic(slots: int) -> int:
    """How many evaluation requests to send at once to an engine decoding `slots` together:
    one batch, less one slot kept free so that live traffic joins the batch at once instead of
    waiting for an evaluation answer to finish (a single slot is shared)."""
    return max(1, slots - 1)


@dataclass(frozen=True)
class EvalSettings:
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 256


@dataclass
class TaskResult:
    task_id: str
    current_score: float
    candidate_score: float
    current_answer: str
    candidate_answer: str
    group: str = DEFAULT_GROUP
    prompt: str = ""  # the task's last user message, for a reviewer
    task_hash: str = ""  # what the task asks and how it is scored (`tasks.task_hash`)
    # The best score a released release reached on this task, and which one; None: none known.
    reference_score: float | None = None
    reference_release_id: str | None = None

    @property
    def bar(self) -> float:
        """The score the candidate must keep: the best released, or the current release's when
        none is known or the current one's is higher."""
        if self.reference_score is None:
            return self.current_score
        return max(self.current_score, self.reference_score)

    def lost(self, margin: float = 0.0) -> bool:
        """The candidate scores lower than the task's bar, by more than `margin`."""
        return self.bar - self.candidate_score > margin


@dataclass
class RoutedArm:
    """A release the candidate's routing policy sends sessions to, answering the same tasks."""

    name: str  # the first arm of routing.yaml that names it
    release: str  # a release id, or `base`
    share: int  # the largest share of a route's sessions it serves
    report: PairedReport  # its answers as the candidate side, beside the current release's


@dataclass
class PairedReport:
    current_release_id: str
    tasks: list[TaskResult] = field(default_factory=list)
    arms: list[RoutedArm] = field(default_factory=list)

    @property
    def current_mean(self) -> float:
        return statistics.fmean(t.current_score for t in self.tasks) if self.tasks else 0.0

    @property
    def candidate_mean(self) -> float:
        return statistics.fmean(t.candidate_score for t in self.tasks) if self.tasks else 0.0

    def groups(self) -> dict[str, PairedReport]:
        """The report of each group of tasks, in the order the groups first appear."""
        named = dict.fromkeys(t.group for t in self.tasks)
        return {
            group: PairedReport(
                self.current_release_id, [t for t in self.tasks if t.group == group]
            )
            for group in named
        }

    def summary(self) -> dict[str, Any]:
        wins = sum(t.candidate_score > t.current_score for t in self.tasks)
        losses = sum(t.candidate_score < t.current_score for t in self.tasks)
        return {
            "current_release_id": self.current_release_id,
            "tasks": len(self.tasks),
            "current_mean": round(self.current_mean, 4),
            "candidate_mean": round(self.candidate_mean, 4),
            "wins": wins,
            "losses": losses,
            "ties": len(self.tasks) - wins - losses,
            "lost": [t.task_id for t in self.tasks if t.lost()],  # regressions, for review
            "groups": {
                name: {
                    "tasks": len(group.tasks),
                    "current_mean": round(group.current_mean, 4),
                    "candidate_mean": round(group.candidate_mean, 4),
                }
                for name, group in self.groups().items()
            },
            "results": [asdict(t) for t in self.tasks],
            "arms": [
                {
                    "name": arm.name,
                    "release": arm.release,
                    "share": arm.share,
                    "candidate_mean": round(arm.report.candidate_mean, 4),
                    "lost": [t.task_id for t in arm.report.tasks if t.lost()],
                }
                for arm in self.arms
            ],
        }


def task_request(task: EvalTask, settings: EvalSettings) -> ChatRequest:
    return ChatRequest.model_validate(
        {"messages": task.messages, "temperature": settings.temperature, "seed": settings.seed}
    )


async def run_paired(
    tasks: list[EvalTask],
    current: Binding,
    candidate: Binding,
    generate: Generate,
    settings: EvalSettings,
    on_task: Callable[[TaskResult], None] | None = None,
    concurrency: int = EVAL_CONCURRENCY,
) -> PairedReport:
    limit = asyncio.Semaphore(concurrency)

    async def answer(request: ChatRequest, binding: Binding) -> str:
        async with limit:
            return await generate(request, binding)

    async def evaluate(task: EvalTask) -> TaskResult:
        request = task_request(task, settings)
        current_answer, candidate_answer = await asyncio.gather(
            answer(request, current), answer(request, candidate)
        )
        result = TaskResult(
            task_id=task.id,
            current_score=score(task.scorer, current_answer, task),
            candidate_score=score(task.scorer, candidate_answer, task),
            current_answer=current_answer,
            candidate_answer=candidate_answer,
            group=task.group,
            prompt=last_user_text(task.messages),
            task_hash=task_hash(task),
        )
        if on_task:
            on_task(result)
        return result

    results = await _all_or_none([evaluate(task) for task in tasks])
    return PairedReport(current_release_id=current.release_id, tasks=results)


async def run_beside(
    report: PairedReport,
    tasks: list[EvalTask],
    binding: Binding,
    generate: Generate,
    settings: EvalSettings,
    concurrency: int = EVAL_CONCURRENCY,
) -> PairedReport:
    """`binding`'s answers to the tasks `report` was evaluated on (`tasks`, in its order), as
    the candidate side beside the current side of `report`."""
    limit = asyncio.Semaphore(concurrency)

    async def evaluate(task: EvalTask, paired: TaskResult) -> TaskResult:
        async with limit:
            answer = await generate(task_request(task, settings), binding)
        return dataclasses.replace(
            paired, candidate_score=score(task.scorer, answer, task), candidate_answer=answer
        )

    results = await _all_or_none(
        [evaluate(task, paired) for task, paired in zip(tasks, report.tasks, strict=True)]
    )
    return PairedReport(report.current_release_id, results)


def as_candidate(report: PairedReport) -> PairedReport:
    """The current side of `report` as the candidate side too: a routed arm that serves the
    current release's own parts, which the report has answered already."""
    same = [
        dataclasses.replace(t, candidate_score=t.current_score, candidate_answer=t.current_answer)
        for t in report.tasks
    ]
    return PairedReport(report.current_release_id, same)


async def _all_or_none(jobs: list[Coroutine[Any, Any, TaskResult]]) -> list[TaskResult]:
    """Every job's result, in order; the first error cancels the others and propagates."""
    running = [asyncio.ensure_future(job) for job in jobs]
    try:
        return list(await asyncio.gather(*running))
    except BaseException:
        for future in running:
            future.cancel()
        raise


def model_generate(model: Model, settings: EvalSettings) -> Generate:
    """Answers from a model under a binding, as the server would serve them; a request that sets
    no token limit (nor does its harness) gets the gate's `max_tokens`."""

    async def generate(request: ChatRequest, binding: Binding) -> str:
        if binding.apply(request).token_limit() is None:
            request = request.model_copy(update={"max_tokens": settings.max_tokens})
        return answer_text(await model.complete(request, binding))

    return generate
