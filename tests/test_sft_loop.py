"""Model-side learning through the whole loop, on the embedded model: serve, feedback, train a LoRA
in the learning worker, gate it on the serving engine, release it, hot-swap it.

A scripted user wants answers that start with "Sure!" and says so only in feedback text. The
`sft` recipe asks the served model the failing prompts again with that feedback beside them,
keeps the answers its scorer accepts, and fine-tunes a LoRA to give them without the hint.
Held-out prompts are measured on the base and on the released adapter in the same run.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from reef.testing.processes import free_port, reef_serve

WANTED = "Start your answer with the word 'Sure!'"
PATTERN = r"^\W*Sure"
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
]
CONFIG = f"""
engine:
  llamacpp: {{n_ctx: 1024, n_threads: 2}}
gate:
  policy: improve
  max_tokens: 24
learning:
  recipe: sft
  interval_s: 0.5
  batch_size: 6
  scorer: {{type: regex, pattern: '{PATTERN}'}}
  hindsight_samples: 4
  hindsight_keep: 2
  max_tokens: 48
  steps: 30
"""


def ask(url: str, prompt: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response


def meets(response: httpx.Response) -> bool:
    text = response.json()["choices"][0]["message"]["content"]
    return re.search(PATTERN, text) is not None


def pass_rate(url: str) -> float:
    return sum(meets(ask(url, prompt)) for prompt in HELD_OUT) / len(HELD_OUT)


@pytest.mark.slow
def test_a_preference_said_in_feedback_is_learned_by_a_lora(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(CONFIG)
    (tmp_path / "evals").mkdir()
    scorer = {"type": "regex", "pattern": PATTERN}
    (tmp_path / "evals/default.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": p}], "scorer": scorer}) + "\n"
            for p in EVALS
        )
    )
    server = reef_serve(tmp_path, free_port())
    with server.start():
        before = pass_rate(server.url)
        for prompt in TRAINING:  # the scripted user: it says what it wants, in words only
            response = ask(server.url, prompt)
            if not meets(response):
                report = {
                    "references": [response.headers["x-reef-agent-record-id"]],
                    "score": 0,
                    "feedback": WANTED,
                }
                httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()

        started = time.monotonic()
        while True:
            status = httpx.get(f"{server.url}/reef/status").json()
            if status["serving"].get("default", "base") != "base":
                break
            last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
            assert last.get("outcome") not in ("rejected", "error", "no proposal"), (
                last,
                server.log()[-3000:],
            )
            assert time.monotonic() - started < 600, server.log()[-3000:]
            time.sleep(2)
        learned_in = time.monotonic() - started
        after = pass_rate(server.url)
        status = httpx.get(f"{server.url}/reef/status").json()
        release = httpx.get(f"{server.url}/reef/scenarios/default/releases").json()["data"][0]
        candidates = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    print(f"held-out pass rate {before:.2f} -> {after:.2f}, released in {learned_in:.0f} s")
    assert release["kind"] == "lora"
    released = next(c for c in candidates if c["state"] == "released")
    losses = released["metrics"]["loss"]
    assert len(losses) == 30 and losses[-1] < losses[0]
    assert status["learning"]["scenarios"]["default"]["last_step"]["loss"] == losses
    assert before <= 0.25, before
    assert after >= 0.75, (before, after)
