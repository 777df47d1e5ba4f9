"""The judge of plain words: a model asked whether an answer does what a user's feedback asked.

Where a scenario's recipe has no scorer, the users' feedback text is the only statement of what
they want ("please answer in one short sentence"), and no program reads it. Its held-out calls
become `feedback` tasks whose scorer is that text (`ScorerSpec(type="feedback")`), and the gate
asks a judge model, greedily, whether each sampled answer does what the text asks
(`FOLLOWS_PROMPT`, the same question hindsight's relabels are accepted by). The judge is the
same model for both sides: the scenario's teacher when one is configured, else the proposer
model (`learning.proposer_url`), else the served model alone (no adapter, no harness), never
what is being judged.

A judge is trusted only as far as it agrees with the users: each held-out task carries the
answer the user's feedback was about (`ScorerSpec.failed`), which the user scored as failing,
and the judge is asked about it too. `Agreement` counts how many of those it refused; a judge
that passes what users failed (a small model says "yes" to anything) cannot decide the feedback
group (`reef.releases.gate`).
"""

from __future__ import annotations

import os
import string
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from reef.errors import ReefError
from reef.evaluation.intervals import wilson
from reef.evaluation.scorers import ScorerError
from reef.evaluation.tasks import EvalTask
from reef.protocol import last_user_text
from reef.urls import without_password

FOLLOWS_PROMPT = """A user asked:
{question}

Their feedback on an earlier answer:
{feedback}

A new answer:
{answer}

Does the new answer do what the feedback asks? Reply with yes or no."""
JUDGE_TOKENS = 4  # "yes" or "no", and room for a full stop
# Characters of the question, the feedback and the answer a judge reads, each: a user's feedback
# of pages (or an answer that ran on) must not push the judge's prompt past its context window,
# which would fail the gate every time that call is held out.
JUDGE_CHARS = 1500

# A prompt in, the judge's reply out.
Ask = Callable[[str], Awaitable[str]]


def says_yes(reply: str) -> bool:
    """Whether a judge's reply starts with yes (after any punctuation or spaces)."""
    return reply.lstrip(string.punctuation + string.whitespace).lower().startswith("yes")


def judge_body(prompt: str) -> dict[str, Any]:
    """The chat request a judge is sent: greedy, a few tokens."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": JUDGE_TOKENS,
    }


@dataclass
class Agreement:
    """How far the judge agrees with the users: of the answers users failed (`asked`), how many
    it refused too (`refused`)."""

    judge: str  # who judged, as a person reads it
    refused: int = 0
    asked: int = 0
    # The distinct answers of either side it judged, and how many it passed: a judge that
    # passes none cannot see a gain, whatever it refuses.
    answers: int = 0
    passed: int = 0

    @property
    def blind(self) -> bool:
        return bool(self.answers) and not self.passed

    def share(self) -> float:
        return self.refused / self.asked if self.asked else 0.0

    def said(self) -> str:
        low, high = wilson(self.refused, self.asked)
        return (
            f"judged by {self.judge}, which refused {self.refused}/{self.asked} [{low:.0%}-"
            f"{high:.0%}] of the answers users failed"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FeedbackJudge:
    """Scores answers to `feedback` tasks: 1 when the judge says the answer does what the
    task's feedback asks. One greedy reply per distinct answer (sampled answers repeat)."""

    def __init__(self, name: str, ask: Ask) -> None:
        self.name = name
        self._ask = ask
        self._said: dict[tuple[str, str, str], bool] = {}

    async def follows(self, question: str, feedback: str, answer: str) -> bool:
        key = (question, feedback, answer)
        if key not in self._said:
            prompt = FOLLOWS_PROMPT.format(
                question=_cut(question), feedback=_cut(feedback), answer=_cut(answer)
            )
            self._said[key] = says_yes(await self._ask(prompt))
        return self._said[key]

    async def score(self, task: EvalTask, answer: str) -> float:
        feedback = task.scorer.criterion
        if not feedback:
            raise ScorerError(f"task {task.id}: a feedback scorer needs `criterion`, the feedback")
        return float(await self.follows(last_user_text(task.messages), feedback, answer))

    async def agreement(self, tasks: list[EvalTask]) -> Agreement:
        """The judge asked about each task's failed answer: how many it refused, as users did;
        and how many of the answers it judged before it passed."""
        judged_before = list(self._said.values())
        measured = Agreement(self.name, answers=len(judged_before), passed=sum(judged_before))
        for task in tasks:
            if task.scorer.type != "feedback" or not task.scorer.failed:
                continue
            measured.asked += 1
            measured.refused += not await self.score(task, task.scorer.failed)
        return measured


def _cut(text: str) -> str:
    return text if len(text) <= JUDGE_CHARS else text[:JUDGE_CHARS] + " […]"


def judged(tasks: list[EvalTask]) -> bool:
    """Whether any task needs the judge."""
    return any(task.scorer.type == "feedback" for task in tasks)


def remote_ask(url: str, model: str | None, api_key_env: str | None, timeout_s: float) -> Ask:
    """Asking an OpenAI-compatible endpoint (a teacher, the proposer): its reply's text."""
    endpoint = f"{url.rstrip('/')}/chat/completions"

    async def ask(prompt: str) -> str:
        headers = {"x-reef-capture": "false"}  # a Reef server as judge records nothing
        if api_key_env and os.environ.get(api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        body = {"model": model or "judge", **judge_body(prompt)}
        shown = without_password(url)
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                response = await client.post(endpoint, json=body, headers=headers)
        except httpx.HTTPError as error:
            raise JudgeUnavailable(
                f"the judge at {shown} did not answer ({type(error).__name__})"
            ) from None
        if response.status_code >= 400:
            asked = f"model {model or 'judge'!r}"
            if not model:
                asked += " (none is set: set teacher.model or learning.proposer_model)"
            raise JudgeUnavailable(
                f"the judge at {shown} answered HTTP {response.status_code}, asked for {asked}"
            )
        return str(response.json()["choices"][0]["message"].get("content") or "")

    return ask


class JudgeUnavailable(ReefError):
    """The judge model could not be asked: the gate cannot score the feedback group (the
    candidate is returned unjudged and tried again later)."""

    status = 503
    code = "judge_unavailable"
