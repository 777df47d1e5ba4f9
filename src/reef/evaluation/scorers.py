"""Scorers: turn one answer to one eval task into a number between 0 and 1."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Annotated, Any

import httpx
from pydantic import AfterValidator

from reef.errors import ReefError
from reef.evaluation.content import kept
from reef.evaluation.facts import states_the_answer
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.protocol import last_user_text
from reef.urls import without_password

JUDGE_PROMPT = (
    "You grade answers. Criterion: {criterion}\n\nAnswer to grade:\n{answer}\n\n"
    "Reply with only a number between 0 and 1: 1 if the answer fully meets the criterion, "
    "0 if it does not."
)


# A `reference` scorer passes an answer that still says half of what the reference said beyond
# the question (see evaluation.content.kept).
REFERENCE_KEPT = 0.5


class ScorerError(ReefError):
    status = 400
    code = "scorer_error"


PROGRAM_SCORERS = "exact, contains, regex, answer, reference, python, or judge with a url"


def program_scorer(spec: ScorerSpec) -> ScorerSpec:
    """`spec`, where a program scores every answer (a recipe's, a teacher's or a shadow's
    scorer); a `feedback` scorer is refused: it is the gate's, the users' words read by a judge
    model (`reef.evaluation.judge`). A ValueError, so that a setting's validation says where."""
    if spec.type == "feedback":
        raise ValueError(
            "a feedback scorer is the gate's own (the users' words, read by a judge model): "
            f"here a program scores every answer, so use {PROGRAM_SCORERS}"
        )
    return spec


# A scorer setting that a program runs (`program_scorer`), for recipes' settings.
ProgramScorer = Annotated[ScorerSpec, AfterValidator(program_scorer)]


def score(spec: ScorerSpec, answer: str, task: EvalTask) -> float:
    if spec.type == "exact":
        return float(answer.strip() == _required(spec.value, "value", spec).strip())
    if spec.type == "contains":
        value = _required(spec.value, "value", spec)
        if spec.case_sensitive:
            return float(value in answer)
        return float(value.lower() in answer.lower())
    if spec.type == "regex":
        return float(re.search(_required(spec.pattern, "pattern", spec), answer) is not None)
    if spec.type == "reference":
        reference = _required(spec.value, "value", spec)
        return float(kept(reference, answer, last_user_text(task.messages)) >= REFERENCE_KEPT)
    if spec.type == "answer":
        right = _required(spec.value, "value", spec)
        short = spec.max_chars is None or len(answer.strip()) <= spec.max_chars
        return float(short and states_the_answer(right, answer, last_user_text(task.messages)))
    if spec.type == "python":
        result = _callable(_required(spec.function, "function", spec))(answer, task)
        return _as_score(result, spec.function or "")
    if spec.type == "feedback":
        raise ScorerError(
            "a feedback scorer is judged by the gate's judge model (reef.evaluation.judge), "
            f"only in the gate: give this check a scorer that a program runs ({PROGRAM_SCORERS})"
        )
    return _judge(spec, answer)


def _required(value: str | None, name: str, spec: ScorerSpec) -> str:
    if value is None:
        raise ScorerError(f"a {spec.type} scorer needs `{name}`")
    return value


def _callable(reference: str) -> Callable[[str, EvalTask], Any]:
    module_name, _, attribute = reference.partition(":")
    if not attribute:
        raise ScorerError(f"python scorer {reference!r} must look like 'package.module:function'")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ScorerError(f"cannot load python scorer {reference!r}: {error}") from None
    if not callable(function):
        raise ScorerError(f"python scorer {reference!r} is not callable")
    return function


def _as_score(result: Any, where: str) -> float:
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float) and 0 <= result <= 1:
        return float(result)
    raise ScorerError(f"scorer {where} returned {result!r}: return a bool or a number in [0, 1]")


def _judge(spec: ScorerSpec, answer: str) -> float:
    url = _required(spec.url, "url", spec).rstrip("/")
    criterion = _required(spec.criterion, "criterion", spec)
    # When the judge is a Reef server (the served model as judge), its calls are not experience.
    headers = {"x-reef-capture": "false"}
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ScorerError(f"the judge's key variable {spec.api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    body = {
        "model": spec.model or "judge",
        "messages": [
            {"role": "user", "content": JUDGE_PROMPT.format(criterion=criterion, answer=answer)}
        ],
        "temperature": 0,
        "max_tokens": 8,
    }
    shown = without_password(url)
    try:
        response = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=120)
    except httpx.HTTPError as error:
        raise ScorerError(f"the judge at {shown} did not answer ({type(error).__name__})") from None
    if response.status_code >= 400:
        raise ScorerError(f"the judge at {shown} answered HTTP {response.status_code}")
    reply = response.json()["choices"][0]["message"]["content"] or ""
    found = re.search(r"\d+(?:\.\d+)?", reply)
    if found is None:
        raise ScorerError(f"the judge's reply has no score in it: {reply[:200]!r}")
    return min(1.0, max(0.0, float(found.group())))
