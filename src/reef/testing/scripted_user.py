"""A scripted user for learning tests and benchmarks: what it asks, and how it judges answers.

The prompts are split three ways: the user asks the training prompts (and gives feedback on
them), the gate compares candidates on the eval prompts, and held-out prompts, never used for
either, measure what was learned.
"""

from __future__ import annotations

import json
import re
import time

import httpx

from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask
from reef.protocol import response_text
from reef.templates import environment

TRAINING = [
    "What is the capital of France?",
    "Name an animal.",
    "What is 2+2?",
    "What colour is the sky?",
    "Name a fruit.",
    "What is the largest ocean?",
]
EVALS = ["Name a colour.", "What is 3+3?", "Name a planet.", "What is the capital of Spain?"]
HELD_OUT = [
    "Name a vegetable.",
    "What is 5+5?",
    "What is the capital of Italy?",
    "Name a musical instrument.",
    "What is the tallest mountain?",
    "Name a bird.",
    "What is 10 minus 3?",
    "What language is spoken in Brazil?",
]


def ask(url: str, prompt: str, max_tokens: int = 32, capture: bool = True) -> httpx.Response:
    """One greedy answer from the server at `url`, as a client gets it (with its receipt; with
    `capture=False`, a measurement: not recorded, so never learned from)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    headers = {} if capture else {"x-reef-capture": "false"}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    response.raise_for_status()
    return response


def meets(response: httpx.Response, pattern: str) -> bool:
    text = response.json()["choices"][0]["message"]["content"]
    return re.search(pattern, text.strip()) is not None


def pass_rate(
    url: str, prompts: list[str], pattern: str, max_tokens: int = 32, capture: bool = True
) -> float:
    """The share of `prompts` whose answer matches `pattern`."""
    passed = sum(meets(ask(url, p, max_tokens, capture), pattern) for p in prompts)
    return passed / len(prompts)


def eval_tasks(prompts: list[str], pattern: str, group: str | None = None) -> str:
    """`evals/<scenario>.jsonl` text: one task per prompt, scored by `pattern` (in `group`)."""
    scorer = {"type": "regex", "pattern": pattern}
    named = {"group": group} if group else {}
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": p}], "scorer": scorer, **named}) + "\n"
        for p in prompts
    )


# -- what the agent knew: the correctness tasks of a `reef init` project ------------------------


def correctness_tasks() -> str:
    """The eval tasks `reef init` writes (short, right answers), as `evals/<scenario>.jsonl`."""
    return environment().get_template("init/evals/default.jsonl.j2").render()


def correct(url: str, max_tokens: int = 32) -> list[str]:
    """The ids of the correctness tasks the server at `url` passes, asked as the gate asks
    (greedy, seed 0) and not recorded."""
    tasks = [EvalTask.model_validate_json(line) for line in correctness_tasks().splitlines()]
    passed = []
    for task in tasks:
        body = {"messages": task.messages, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
        headers = {"x-reef-capture": "false"}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
        reply.raise_for_status()
        if score(task.scorer, response_text(reply.json()), task) >= 0.5:
            passed.append(task.id)
    return passed


# -- a user who says what it wants only in its next message (OpenClaw-style) ---------------------

SHORT_WORDS = 12  # an answer of at most this many words is short enough for this user
SHORT_PATTERN = rf"^\s*\S+(\s+\S+){{0,{SHORT_WORDS - 1}}}\s*$"
CORRECTION = "No, shorter: answer in a few words."
APPROVAL = "Thanks, that's what I wanted."


def words(text: str) -> int:
    return len(text.split())


def converse(url: str, prompt: str, session: str, max_tokens: int = 48) -> tuple[str, str]:
    """One sampled answer to `prompt`, then the user's next message in the same session: a
    correction when the answer is long, thanks when it is short. No score is ever reported.
    Returns the answer and the user's reply."""
    headers = {"x-reef-session": session}
    messages = [{"role": "user", "content": prompt}]
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 1.0}
    first = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    first.raise_for_status()
    answer = first.json()["choices"][0]["message"]["content"] or ""
    reply = APPROVAL if words(answer) <= SHORT_WORDS else CORRECTION
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": reply}]
    body = {"messages": messages, "max_tokens": 16, "temperature": 1.0}
    httpx.post(
        f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600
    ).raise_for_status()
    return answer, reply


def mean_words(url: str, prompts: list[str], max_tokens: int = 48, capture: bool = True) -> float:
    """The mean length in words of the greedy answers to `prompts`."""
    answers = [response_text(ask(url, p, max_tokens, capture).json()) for p in prompts]
    return sum(words(a) for a in answers) / len(answers)


def decided(url: str, seen: int, budget: float, scenario: str = "default") -> dict:
    """The next candidate the gate decides (after `seen` decided ones), or {} past `budget` s."""
    started = time.monotonic()
    while time.monotonic() - started < budget:
        listed = httpx.get(f"{url}/reef/scenarios/{scenario}/candidates").json()["data"]
        done = [c for c in listed if c["state"] in ("released", "rejected")]
        if len(done) > seen:
            return done[0]
        time.sleep(2)
    return {}
