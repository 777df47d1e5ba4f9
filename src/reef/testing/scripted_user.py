"""A scripted user for learning tests and benchmarks: what it asks, and how it judges answers.

The prompts are split three ways: the user asks the training prompts (and gives feedback on
them), the gate compares candidates on the eval prompts, and held-out prompts, never used for
either, measure what was learned.
"""

from __future__ import annotations

import json
import re

import httpx

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


def ask(url: str, prompt: str, max_tokens: int = 32) -> httpx.Response:
    """One greedy answer from the server at `url`, as a client gets it (with its receipt)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response


def meets(response: httpx.Response, pattern: str) -> bool:
    text = response.json()["choices"][0]["message"]["content"]
    return re.search(pattern, text.strip()) is not None


def pass_rate(url: str, prompts: list[str], pattern: str, max_tokens: int = 32) -> float:
    """The share of `prompts` whose answer matches `pattern`."""
    return sum(meets(ask(url, p, max_tokens), pattern) for p in prompts) / len(prompts)


def eval_tasks(prompts: list[str], pattern: str) -> str:
    """`evals/<scenario>.jsonl` text: one task per prompt, scored by `pattern`."""
    scorer = {"type": "regex", "pattern": pattern}
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": p}], "scorer": scorer}) + "\n"
        for p in prompts
    )


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


def mean_words(url: str, prompts: list[str], max_tokens: int = 48) -> float:
    """The mean length in words of the greedy answers to `prompts`."""
    answers = [ask(url, p, max_tokens).json()["choices"][0]["message"]["content"] for p in prompts]
    return sum(words(a or "") for a in answers) / len(answers)
