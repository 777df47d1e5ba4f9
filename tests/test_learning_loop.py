"""The whole loop on the real engine: traffic, feedback, harness evolution, gate, release, hot-swap.

A scripted user wants every answer to end with a sign-off line the base model never writes. It
talks to `reef serve` (with the harness_evolve recipe and its hindsight proposer) and
scores each answer. The learning worker, a separate process started by the server, turns the
feedback into a harness candidate, the gate checks it against the eval tasks, and the server
switches to the release: held-out prompts then end with the sign-off far more often.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx

from reef.testing.processes import free_port, reef_serve
from tests.conftest import TOKEN

SIGN_OFF = "Cheers, Reef"
FEEDBACK = f"End every answer with the line: {SIGN_OFF}"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
TRAINING = ["What is the capital of France?", "Name an animal.", "What is 2+2?"]
EVALS = ["What colour is grass?", "Name a planet.", "What is 3+3?"]
HELD_OUT = ["What is the capital of Italy?", "Name a fruit.", "What is 5+5?", "Name a colour."]
CONFIG = f"""
engine:
  llamacpp: {{n_ctx: 2048, n_threads: 2}}
gate:
  policy: improve
  max_tokens: 48
learning:
  recipe: harness_evolve
  mode: auto
  interval_s: 0.5
  proposer: hindsight
  batch_size: 3
  scorer: {{type: regex, pattern: "{SIGN_OFF}\\\\s*$"}}
"""


def ask(url: str, prompt: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    response.raise_for_status()
    return response


def signs_off(response: httpx.Response) -> bool:
    text = response.json()["choices"][0]["message"]["content"]
    return re.search(rf"{SIGN_OFF}\s*$", text) is not None


def pass_rate(url: str) -> float:
    return sum(signs_off(ask(url, prompt)) for prompt in HELD_OUT) / len(HELD_OUT)


def children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def started_children(pid: int, timeout: float = 30) -> set[int]:
    """The server starts its worker once it listens: wait for it to appear."""
    deadline = time.monotonic() + timeout
    while not (found := children(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def processes_mapping(pids: set[int], suffix: str) -> set[int]:
    """Which of `pids` have a file ending in `suffix` mapped (the model, for llama.cpp)."""
    return {
        pid
        for pid in pids
        if Path(f"/proc/{pid}/maps").exists()
        and any(
            line.endswith(suffix) for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        )
    }


def test_feedback_evolves_the_harness_and_the_server_serves_it(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(CONFIG)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "messages": [{"role": "user", "content": p}],
                    "scorer": {"type": "regex", "pattern": f"{SIGN_OFF}\\s*$"},
                }
            )
            + "\n"
            for p in EVALS
        )
    )
    server = reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN})
    with server.start():
        assert server.process is not None
        worker_pids = started_children(server.process.pid)
        assert worker_pids, "reef serve should start the learning worker as a child process"
        before = pass_rate(server.url)

        for prompt in TRAINING:  # the scripted user
            response = ask(server.url, prompt)
            if not signs_off(response):
                report = {
                    "references": [response.headers["x-reef-agent-record-id"]],
                    "score": 0,
                    "feedback": FEEDBACK,
                }
                httpx.post(
                    f"{server.url}/reef/report", json=report, headers=HEADERS
                ).raise_for_status()

        deadline = time.monotonic() + 180
        while True:
            status = httpx.get(f"{server.url}/reef/status", headers=HEADERS).json()
            if status["serving"].get("default", "base") != "base":
                break
            last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
            assert last.get("outcome") not in ("rejected", "error"), last
            assert time.monotonic() < deadline, f"no release: {status['learning']}\n{server.log()}"
            time.sleep(1)

        # One model per machine: the worker evaluated on the server's engine, whose model only
        # the server maps, and its evaluations were not recorded as traffic.
        tree = {server.process.pid, *worker_pids}
        assert processes_mapping(tree, ".gguf") == {server.process.pid}
        records = status["store"]["scenarios"]["default"]["records"]
        assert records == len(HELD_OUT) + len(TRAINING), status["store"]

        after = pass_rate(server.url)
        learning = status["learning"]["scenarios"]["default"]
        assert learning["last_step"]["outcome"] == "released"
        assert learning["consumed"] >= 1 or learning["batches_built"] >= 1
        releases = httpx.get(
            f"{server.url}/reef/scenarios/default/releases", headers=HEADERS
        ).json()
        assert "examples.jsonl" in releases["data"][0]["reason"]
        assert f"{SIGN_OFF}" in releases["data"][0]["diff"]  # released with its diff
    assert after > before, (before, after)
    assert after >= 0.5
    for pid in worker_pids:  # Ctrl-C stopped the worker too
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
