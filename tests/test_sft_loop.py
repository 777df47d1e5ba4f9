"""Model-side learning through the whole loop, on the embedded model: serve, feedback, train a LoRA
in the learning worker, gate it on the serving engine, release it, hot-swap it.

A scripted user wants answers that start with "Sure!" and says so only in feedback text. The
`sft` recipe asks the served model the failing prompts again with that feedback beside them,
keeps the answers its scorer accepts, and fine-tunes a LoRA to give them without the hint.
Held-out prompts are measured on the base and on the released adapter in the same run.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from reef.testing import scripted_user
from reef.testing.processes import free_port, reef_serve

WANTED = "Start your answer with the word 'Sure!'"
PATTERN = r"^\W*Sure"
HELD_OUT = scripted_user.HELD_OUT[:4]
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
    return scripted_user.ask(url, prompt, max_tokens=24)


def meets(response: httpx.Response) -> bool:
    return scripted_user.meets(response, PATTERN)


def pass_rate(url: str) -> float:
    return scripted_user.pass_rate(url, HELD_OUT, PATTERN, max_tokens=24)


@pytest.mark.slow
def test_a_preference_said_in_feedback_is_learned_by_a_lora(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(CONFIG)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(
        scripted_user.eval_tasks(scripted_user.EVALS, PATTERN)
    )
    server = reef_serve(tmp_path, free_port())
    with server.start():
        before = pass_rate(server.url)
        # The scripted user says what it wants, in words only.
        for prompt in scripted_user.TRAINING:
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
