"""Model-side learning through the whole loop, on the embedded model: serve, feedback, train a LoRA
in the learning worker, gate it on the serving engine, release it, hot-swap it; and the same with
`checkpoint: true`, where the trained LoRA is merged into full weights (a `checkpoint` release that
llama.cpp loads beside the model it serves).

A scripted user wants answers that start with "Sure!" and writes out, for each training prompt,
the answer it wanted (a demonstration). The `sft` recipe fine-tunes a LoRA on those examples, the
gate evaluates it on the serving engine, and the server switches to it: the next call is served
under the adapter. Every step holds whatever the model samples on this machine (the training data
is the user's, the gate's floor of 0, with no rule for any group, releases whatever the
evaluation scored); whether held-out
answers then start with "Sure!" is a learning outcome, measured by `bench/learning/preferences.py`.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from reef.config import GateConfig
from reef.evaluation.held_out import held_out as held_out_for_the_gate
from reef.testing import scripted_user
from reef.testing.processes import free_port, reef_serve

PATTERN = r"^\W*Sure"
CONFIG = f"""
engine:
  llamacpp: {{n_ctx: 1024, n_threads: 2}}
gate:
  policy: floor
  floor: 0.0
  max_tokens: 24
  groups: {{feedback: {{rule: any}}}}  # the mechanics are tested here, not what is learned
learning:
  recipe: sft
  interval_s: 0.5
  batch_size: 4  # of the 6 training prompts, 2 are held out for the gate (gate.held_out)
  scorer: {{type: regex, pattern: '{PATTERN}'}}
  steps: 4  # enough to move the loss and the log-probabilities; learning itself is a benchmark
  replay: 0  # sft's replay of other answers: tests/learning/test_sft_replay.py
"""


def ask(url: str, prompt: str) -> httpx.Response:
    return scripted_user.ask(url, prompt, max_tokens=24)


def record(url: str, response: httpx.Response) -> dict:
    record_id = response.headers["x-reef-agent-record-id"]
    return httpx.get(f"{url}/reef/records/{record_id}").json()


@pytest.mark.parametrize("kind", ["lora", "checkpoint"])
def test_answers_the_user_wrote_train_a_lora_that_serves(tmp_path: Path, kind: str) -> None:
    merged = "  checkpoint: true\n" if kind == "checkpoint" else ""
    (tmp_path / "reef.yaml").write_text(CONFIG + merged)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(
        scripted_user.eval_tasks(scripted_user.EVALS, PATTERN)
    )
    held_out = scripted_user.HELD_OUT[0]
    server = reef_serve(tmp_path, free_port())
    with server.start():
        base = record(server.url, ask(server.url, held_out))
        for prompt in scripted_user.TRAINING:  # the scripted user writes what it wanted
            response = ask(server.url, prompt)
            answer = response.json()["choices"][0]["message"]["content"].strip()
            report = {
                "references": [response.headers["x-reef-agent-record-id"]],
                "score": 0,
                "feedback": {"demonstration": f"Sure! {answer}"},
            }
            httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()

        started = time.monotonic()
        while True:
            status = httpx.get(f"{server.url}/reef/status").json()
            if status["serving"].get("default", "base") != "base":
                break
            last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
            assert last.get("outcome") not in ("rejected", "held", "error", "no proposal"), (
                last,
                server.log()[-3000:],
            )
            assert time.monotonic() - started < 600, server.log()[-3000:]
            time.sleep(0.5)
        status = httpx.get(f"{server.url}/reef/status").json()
        release = httpx.get(f"{server.url}/reef/scenarios/default/releases").json()["data"][0]
        candidates = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
        served = ask(server.url, held_out)
        adapted = record(server.url, served)
    assert release["kind"] == kind
    released = next(c for c in candidates if c["state"] == "released")
    # One a demonstration, but for the prompts the gate holds out (gate.held_out, by their words).
    share = GateConfig().held_out
    learned = [p for p in scripted_user.TRAINING if not held_out_for_the_gate(p, share)]
    assert released["metrics"]["examples"] == len(learned) == 4
    losses = released["metrics"]["loss"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert status["learning"]["scenarios"]["default"]["last_step"]["loss"] == losses
    # Hot-swapped: the same greedy request is now served under the adapter, which moves the
    # model's log-probabilities (the first token's, whatever token it is).
    assert served.headers["x-reef-release-id"] == release["release_id"] == adapted["release_id"]
    assert base["release_id"] == "base"
    assert base["prompt_token_ids"] == adapted["prompt_token_ids"]  # the weights add no prompt
    if adapted["completion_token_ids"][0] == base["completion_token_ids"][0]:
        change = abs(adapted["completion_logprobs"][0] - base["completion_logprobs"][0])
        assert change > 1e-4, (base["completion_logprobs"][:3], adapted["completion_logprobs"][:3])
