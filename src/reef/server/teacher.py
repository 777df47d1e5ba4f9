"""A teacher the student learns from: a stronger OpenAI-compatible model behind the served one.

With `teacher.url` set (or `scenarios.<name>.teacher`), a whole chat completions call of the
scenario goes to the teacher when the student's answer fails a check:

- `check_json`: the request asks for JSON (`response_format`) or forces a tool call, and the
  answer does not parse (or does not meet the schema it names);
- `scorer`: an eval scorer (`regex`, `contains`, `judge`, ...) the answer fails (below 0.5);
- `min_mean_logprob`: the mean log-prob of the answer's tokens is below it (llama.cpp reports
  them), a student unsure of itself;

or outright, without asking the student, for `share` percent of sessions (sticky, by a hash of
`x-reef-session`). The user gets the teacher's answer; its record says `arm: teacher` and the
engine `teacher`, and a report on it carries the answer as a demonstration
(`{"demonstration": "..."}`), which `sft`, the other weight recipes and `harness_evolve` learn
from, so the share of calls the teacher takes falls as the student learns. A teacher that
cannot answer leaves the student's answer in place. Streamed calls stay with the student. What
the teacher costs (calls by reason, tokens, failures) is in `/reef/status` under `teachers`.

The serving core hands a whole call of a scenario with a teacher to `Teacher.take_over`, with a
way to ask the student, and gets back an `Answer`: whose completion it serves, the call as its
record names it (the arm `teacher`, and under a routing policy `failed_arm`, the arm whose
answer failed its check: a canary counts it as that arm's failure), and the demonstration to
report once the record is stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from starlette.requests import Request

from reef.config import TeacherConfig
from reef.engines.upstream import UpstreamEngine
from reef.errors import ReefError
from reef.evaluation.scorers import program_scorer, score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.protocol import ChatRequest, Completion
from reef.server.call import CallContext
from reef.server.cancellation import until_disconnected
from reef.store import ExperienceStore, Report

log = logging.getLogger("reef.teacher")
TEACHER_ARM = "teacher"
OUTRIGHT = "share"  # the reason of a call the teacher takes without asking the student
PASSING = 0.5  # a scorer's score at or above it passes
CHECKS_AT_ONCE = 2  # checks of student answers running at once (a judge may take 120 s)

# Asks the student (the served engine) for its answer to the call.
Student = Callable[[], Coroutine[Any, Any, Completion]]


@dataclass
class Lesson:
    """Why the teacher answered a call, and what it said."""

    reason: str
    completion: Completion
    asked_at: float  # time.perf_counter() as the teacher was asked

    @property
    def text(self) -> str:
        message = self.completion.response["choices"][0]["message"]
        return str(message.get("content") or "")

    def answer(self, call: CallContext) -> Answer:
        """The teacher's answer to `call`, the call as its record names it."""
        return Answer(self.completion, _taught(call, replaced_answer=self.reason != OUTRIGHT), self)


@dataclass(frozen=True)
class Answer:
    """What serves a whole call: the student's completion, or the teacher's with its `lesson`;
    `call` is the call as its record names it."""

    completion: Completion
    call: CallContext
    lesson: Lesson | None = None

    async def demonstrate(self, store: ExperienceStore, record_id: str) -> None:
        """The teacher's answer, reported on its record as a demonstration for the recipes to
        learn from (nothing when the student answered)."""
        if self.lesson is None:
            return
        report = Report(
            scenario=self.call.scenario,
            references=[record_id],
            feedback={"demonstration": self.lesson.text},
            metadata={"source": "teacher", "reason": self.lesson.reason},
        )
        await asyncio.wrap_future(store.add_report(report))


def _taught(call: CallContext, replaced_answer: bool) -> CallContext:
    """`call` as the teacher answered it: outright, or in place of the student's answer
    (`replaced_answer`), which under a routing policy failed the arm the call took (a canary
    counts it as that arm's failure)."""
    if call.route is None:
        return dataclasses.replace(
            call, route=(call.release_id, TEACHER_ARM), answered_by=TEACHER_ARM
        )
    policy, arm = call.route
    return dataclasses.replace(
        call,
        route=(policy, TEACHER_ARM),
        answered_by=TEACHER_ARM,
        failed_arm=arm if replaced_answer else None,
    )


@dataclass
class TeacherCosts:
    calls: Counter[str] = field(default_factory=Counter)  # by reason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0
    undecided: int = 0  # checks that could not decide (a judge away): the student's answer stood
    student_calls: int = 0  # whole calls the student answered itself

    def to_json(self) -> dict[str, Any]:
        taught = sum(self.calls.values())
        asked = taught + self.student_calls
        return {
            "calls": taught,
            "by_reason": dict(self.calls),
            "share_of_calls": taught / asked if asked else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "failures": self.failures,
            "undecided": self.undecided,
        }


class Teacher:
    def __init__(self, scenario: str, settings: TeacherConfig) -> None:
        assert settings.url is not None
        self.scenario = scenario
        self.settings = settings
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        self.engine = UpstreamEngine(
            base_url=settings.url, model=settings.model, api_key=key, timeout_s=settings.timeout_s
        )
        self.costs = TeacherCosts()
        self._scorer = (
            program_scorer(ScorerSpec.model_validate(settings.scorer)) if settings.scorer else None
        )
        self._checks = asyncio.Semaphore(CHECKS_AT_ONCE)

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def take_over(
        self, request: Request, call: CallContext, chat: ChatRequest, student: Student
    ) -> Answer:
        """Who answers a whole call: the teacher outright for its share of sessions, else the
        student, unless its answer fails a check and the teacher can answer in its place. Each
        model's answer is dropped if the client hangs up (`until_disconnected`)."""
        if self.takes_session(call.session):
            lesson = await until_disconnected(request, self.answer(chat, OUTRIGHT))
            if lesson is not None:
                return lesson.answer(call)
        completion = await until_disconnected(request, student())
        try:
            reason = await self._check(chat, completion)
        except ReefError as error:  # a judge away or refusing: the student's answer stands
            self.costs.undecided += 1
            log.warning("teacher of %s could not check an answer: %s", self.scenario, error.message)
            return Answer(completion, call)
        if reason is None:
            self.costs.student_calls += 1
            return Answer(completion, call)
        lesson = await until_disconnected(request, self.answer(chat, reason))
        return lesson.answer(call) if lesson is not None else Answer(completion, call)

    async def _check(self, chat: ChatRequest, completion: Completion) -> str | None:
        """`failed_check` in a thread (a `judge` scorer asks a model over HTTP), at most
        `CHECKS_AT_ONCE` at a time, so that slow judges cannot take every worker thread."""
        async with self._checks:
            return await asyncio.to_thread(self.failed_check, chat, completion)

    def takes_session(self, session: str | None) -> bool:
        """Whether the teacher answers this session outright (`share` percent, sticky)."""
        share = self.settings.share
        if share <= 0:
            return False
        if session is None:
            return random.random() * 100 < share
        digest = hashlib.sha256(f"teacher\0{self.scenario}\0{session}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % 100 < share

    def failed_check(self, request: ChatRequest, answer: Completion) -> str | None:
        """The check the student's answer fails, by name, or None."""
        if self.settings.check_json and (problem := _json_problem(request, answer)):
            return problem
        if self._scorer is not None:
            task = EvalTask(
                messages=[m.model_dump() for m in request.messages], scorer=self._scorer
            )
            if score(self._scorer, _content(answer), task) < PASSING:
                return "scorer"
        floor, logprobs = self.settings.min_mean_logprob, answer.token_logprobs
        if floor is not None and logprobs and statistics.fmean(logprobs) < floor:
            return "low_logprob"
        return None

    async def answer(self, request: ChatRequest, reason: str) -> Lesson | None:
        """The teacher's answer to `request`, or None when it could not answer (logged)."""
        asked_at = time.perf_counter()
        try:
            completion = await self.engine.complete(request)
        except ReefError as error:
            self.costs.failures += 1
            log.warning("teacher of %s could not answer: %s", self.scenario, error.message)
            return None
        usage = completion.response.get("usage") or {}
        self.costs.calls[reason] += 1
        self.costs.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.costs.completion_tokens += int(usage.get("completion_tokens") or 0)
        return Lesson(reason, completion, asked_at)


def teachers_of(config: Any, scenarios: list[str]) -> dict[str, Teacher]:
    """A teacher for each scenario whose settings name one."""
    found = {}
    for scenario in scenarios:
        settings = config.teacher_for(scenario)
        if settings.url:
            found[scenario] = Teacher(scenario, settings)
    return found


def _content(answer: Completion) -> str:
    message = answer.response["choices"][0]["message"]
    return str(message.get("content") or "")


def _json_problem(request: ChatRequest, answer: Completion) -> str | None:
    """`invalid_json` or `invalid_tool_call` where the request held the answer to a shape and
    the answer breaks it; None otherwise."""
    message = answer.response["choices"][0]["message"]
    if request.tool_choice not in (None, "auto", "none"):
        calls = message.get("tool_calls") or []
        if not calls or not all(_parses(c.get("function", {}).get("arguments")) for c in calls):
            return "invalid_tool_call"
        return None
    shape = (request.response_format or {}).get("type")
    if shape not in ("json_object", "json_schema"):
        return None
    try:
        parsed = json.loads(message.get("content") or "")
    except ValueError:
        return "invalid_json"
    schema = ((request.response_format or {}).get("json_schema") or {}).get("schema")
    if schema:
        try:
            jsonschema.validate(parsed, schema)
        except jsonschema.ValidationError:
            return "invalid_json"
    return None


def _parses(arguments: Any) -> bool:
    if not isinstance(arguments, str):
        return False
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True
