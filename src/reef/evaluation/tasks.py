"""Eval tasks: `evals/<scenario>.jsonl`, one task per line: input messages plus a scorer spec.

    {"id": "capital", "messages": [{"role": "user", "content": "Capital of France?"}],
     "scorer": {"type": "contains", "value": "Paris"}}

Scorer types: `exact` (`value`), `contains` (`value`, `case_sensitive`), `regex` (`pattern`),
`reference` (`value`, a good answer: 1 when the answer still says at least half of its content
words, see `evaluation.content`), `python` (`function`: "module:function", called with the answer
and the task, returning a number or a bool), `judge` (`criterion`, `model`, `url`,
`api_key_env`: an OpenAI-compatible model asked for a score between 0 and 1).

A task may name its `group` (any name; `default` when it names none): the gate holds each group
to its rule (`gate.groups`), e.g. correctness tasks that must not regress beside the tasks of a
user's preference that must improve.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.errors import ReefError, describe_validation_error

DEFAULT_GROUP = "default"
FEEDBACK_GROUP = "feedback"  # a recipe's tasks: the prompts users gave feedback on


class ScorerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal[
        "exact", "contains", "regex", "reference", "python", "judge", "answer", "feedback"
    ]
    value: str | None = None
    # `answer`: the longest answer that passes (a short answer is asked for); none: any length.
    max_chars: int | None = Field(None, ge=1)
    pattern: str | None = None
    case_sensitive: bool = False
    function: str | None = None
    # `judge`: what the judge at `url` grades against; `feedback`: what the user said they
    # wanted, in their words, which the gate's judge model reads (`reef.evaluation.judge`).
    criterion: str | None = None
    # `feedback`: the answer the user's feedback was about, which they scored as failing: the
    # judge is trusted only as far as it refuses such answers too.
    failed: str | None = None
    model: str | None = None
    url: str | None = None
    api_key_env: str | None = None


class EvalTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    scorer: ScorerSpec
    group: str = DEFAULT_GROUP


class EvalTasksError(ReefError):
    status = 400
    code = "bad_eval_tasks"


def load_tasks(path: Path) -> list[EvalTask]:
    """Every task in a JSONL file; an error names the line and what is wrong with it."""
    if not path.is_file():
        raise EvalTasksError(
            f"no eval tasks at {path}: write one JSON task per line (see `reef init`'s example)"
        )
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = EvalTask.model_validate(json.loads(line))
        except ValueError as error:
            detail = (
                describe_validation_error(error) if isinstance(error, ValidationError) else error
            )
            raise EvalTasksError(f"{path}:{number}: {detail}") from None
        tasks.append(task.model_copy(update={"id": task.id or f"{path.stem}:{number}"}))
    if not tasks:
        raise EvalTasksError(f"{path} holds no tasks")
    return tasks


def task_hash(task: EvalTask) -> str:
    """What a task asks and how it is scored, hashed: an edited task is a new task."""
    asked = {"messages": task.messages, "scorer": task.scorer.model_dump(exclude_defaults=True)}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]


def tasks_path(evals_dir: Path, scenario: str) -> Path:
    return evals_dir / f"{scenario}.jsonl"
