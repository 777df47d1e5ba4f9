"""Paired evaluation: the current release and a candidate answer the same tasks, same settings.

Both sides get the same messages, sampling settings and seeds, so the only difference between
their answers is the artifact. Each task is answered `samples` times on each side, as it is
served (sampled), answer i on the seed `seed + i` on both sides: a task's score is its mean over
the samples (its pass rate, for a 1/0 scorer), and the samples are kept with the result for the
gate's intervals (`reef.releases.gate`). A greedy evaluation (temperature 0) answers once: its
answers would all be the same. Tasks are sent concurrently (at most `concurrency` requests at a
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

from reef.evaluation.intervals import worse_beyond_noise
from reef.evaluation.judge import Agreement, FeedbackJudge, judged
from reef.evaluation.scorers import ScorerError, score
from reef.evaluation.tasks import DEFAULT_GROUP, EvalTask, task_hash
from reef.inference.binding import Binding
from reef.inference.model import Model, answer_text
from reef.protocol import ChatRequest, last_user_text

PASS = 0.5  # a sample's score at which it counts as passed

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
    # None: the engine's default, as a request that sets none is served.
    temperature: float | None = 0.0
    seed: int = 0
    max_tokens: int = 256
    samples: int = 1  # answers per task and side (1 when greedy)

    @property
    def answers_per_task(self) -> int:
        return 1 if self.temperature == 0 else max(1, self.samples)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"samples": self.answers_per_task}


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
    # Each sample's score, on each side (the scores above are their means); one sample: empty.
    current_scores: list[float] = field(default_factory=list)
    candidate_scores: list[float] = field(default_factory=list)
    current_answers: list[str] = field(default_factory=list)
    candidate_answers: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return max(1, len(self.candidate_scores))

    @property
    def current_passes(self) -> int:
        return _passes(self.current_scores or [self.current_score])

    @property
    def candidate_passes(self) -> int:
        return _passes(self.candidate_scores or [self.candidate_score])

    @property
    def bar_passes(self) -> float:
        """The bar (`bar`) in samples passed: the current release's passes, or the best
        released's rate over as many samples when that is higher."""
        if self.reference_score is None:
            return self.current_passes
        return max(self.current_passes, self.reference_score * self.samples)

    @property
    def bar(self) -> float:
        """The score the candidate must keep: the best released, or the current release's when
        none is known or the current one's is higher."""
        if self.reference_score is None:
            return self.current_score
        return max(self.current_score, self.reference_score)

    def lost(self, margin: float = 0.0) -> bool:
        """The candidate scores lower than the task's bar, by more than `margin`: answered
        once (greedy), lower at all; sampled, lower beyond the noise of its samples (one-sided,
        `reef.evaluation.intervals.worse_beyond_noise`), never one sample flipping."""
        if self.samples == 1:
            return self.bar - self.candidate_score > margin
        return worse_beyond_noise(self.bar_passes, self.candidate_passes, self.samples, margin)


def _passes(scores: list[float]) -> int:
    return sum(score >= PASS for score in scores)


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
    settings: EvalSettings | None = None  # how the chat tasks were answered
    # The judge of the `feedback` tasks written in plain words, and how far it agrees with the
    # users (`reef.evaluation.judge`); None: no task needed one.
    judge: Agreement | None = None

    @property
    def current_mean(self) -> float:
        return statistics.fmean(t.current_score for t in self.tasks) if self.tasks else 0.0

    @property
    def candidate_mean(self) -> float:
        return statistics.fmean(t.candidate_score for t in self.tasks) if self.tasks else 0.0

    @property
    def answered(self) -> int:
        """Samples answered on each side, over every task."""
        return sum(t.samples for t in self.tasks)

    @property
    def current_passes(self) -> int:
        return sum(t.current_passes for t in self.tasks)

    @property
    def candidate_passes(self) -> int:
        return sum(t.candidate_passes for t in self.tasks)

    @property
    def bar_passes(self) -> float:
        return sum(t.bar_passes for t in self.tasks)

    @property
    def sampled(self) -> bool:
        return any(t.samples > 1 for t in self.tasks)

    def groups(self) -> dict[str, PairedReport]:
        """The report of each group of tasks, in the order the groups first appear."""
        named = dict.fromkeys(t.group for t in self.tasks)
        return {
            group: PairedReport(
                self.current_release_id,
                [t for t in self.tasks if t.group == group],
                settings=self.settings,
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
                    "answered": group.answered,  # samples on each side
                    "current_passes": group.current_passes,
                    "candidate_passes": group.candidate_passes,
                }
                for name, group in self.groups().items()
            },
            "sampling": self.settings.to_json() if self.settings else None,
            "judge": self.judge.to_json() if self.judge else None,
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


def task_request(task: EvalTask, settings: EvalSettings, sample: int = 0) -> ChatRequest:
    """The request for answer `sample` of a task: the same on both sides of a paired run."""
    body: dict[str, Any] = {"messages": task.messages, "seed": settings.seed + sample}
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    return ChatRequest.model_validate(body)


@dataclass(frozen=True)
class Sampled:
    """One side's answers to a task, one per sample, and their scores."""

    answers: list[str]
    scores: list[float]

    @property
    def score(self) -> float:
        return statistics.fmean(self.scores)


async def sample_task(
    task: EvalTask,
    binding: Binding,
    generate: Generate,
    settings: EvalSettings,
    limit: asyncio.Semaphore,
    judge: FeedbackJudge | None = None,
) -> Sampled:
    """`binding`'s answers to `task`, `settings.answers_per_task` of them, sent together (an
    engine that batches decodes them as one batch, on the prompt it cached for the first),
    scored by the task's scorer, or, for a `feedback` task, by `judge`."""

    async def answer(sample: int) -> str:
        async with limit:
            return await generate(task_request(task, settings, sample), binding)

    answers = list(await asyncio.gather(*map(answer, range(settings.answers_per_task))))
    if task.scorer.type != "feedback":
        return Sampled(answers, [score(task.scorer, answer, task) for answer in answers])
    if judge is None:
        raise ScorerError(f"task {task.id} is judged by feedback, and no judge was given")
    return Sampled(answers, [await judge.score(task, answer) for answer in answers])


def _as_candidate(result: TaskResult, side: Sampled) -> TaskResult:
    many = len(side.answers) > 1
    return dataclasses.replace(
        result,
        candidate_score=side.score,
        candidate_answer=side.answers[0],
        candidate_scores=side.scores if many else [],
        candidate_answers=side.answers if many else [],
    )


async def run_paired(
    tasks: list[EvalTask],
    current: Binding,
    candidate: Binding,
    generate: Generate,
    settings: EvalSettings,
    on_task: Callable[[TaskResult], None] | None = None,
    concurrency: int = EVAL_CONCURRENCY,
    judge: FeedbackJudge | None = None,
) -> PairedReport:
    limit = asyncio.Semaphore(concurrency)

    async def evaluate(task: EvalTask) -> TaskResult:
        now, then = await asyncio.gather(
            sample_task(task, current, generate, settings, limit, judge),
            sample_task(task, candidate, generate, settings, limit, judge),
        )
        many = len(now.answers) > 1
        result = TaskResult(
            task_id=task.id,
            current_score=now.score,
            candidate_score=now.score,
            current_answer=now.answers[0],
            candidate_answer=now.answers[0],
            group=task.group,
            prompt=last_user_text(task.messages),
            task_hash=task_hash(task),
            current_scores=now.scores if many else [],
            current_answers=now.answers if many else [],
        )
        result = _as_candidate(result, then)
        if on_task:
            on_task(result)
        return result

    results = await _all_or_none([evaluate(task) for task in tasks])
    agreement = await judge.agreement(tasks) if judge and judged(tasks) else None
    return PairedReport(current.release_id, results, settings=settings, judge=agreement)


async def run_beside(
    report: PairedReport,
    tasks: list[EvalTask],
    binding: Binding,
    generate: Generate,
    settings: EvalSettings,
    concurrency: int = EVAL_CONCURRENCY,
    judge: FeedbackJudge | None = None,
) -> PairedReport:
    """`binding`'s answers to the tasks `report` was evaluated on (`tasks`, in its order), as
    the candidate side beside the current side of `report`."""
    limit = asyncio.Semaphore(concurrency)

    async def evaluate(task: EvalTask, paired: TaskResult) -> TaskResult:
        sampled = await sample_task(task, binding, generate, settings, limit, judge)
        return _as_candidate(paired, sampled)

    results = await _all_or_none(
        [evaluate(task, paired) for task, paired in zip(tasks, report.tasks, strict=True)]
    )
    return PairedReport(report.current_release_id, results)


def as_candidate(report: PairedReport) -> PairedReport:
    """The current side of `report` as the candidate side too: a routed arm that serves the
    current release's own parts, which the report has answered already."""
    same = [
        dataclasses.replace(
            t,
            candidate_score=t.current_score,
            candidate_answer=t.current_answer,
            candidate_scores=list(t.current_scores),
            candidate_answers=list(t.current_answers),
        )
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
