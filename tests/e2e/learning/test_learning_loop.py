"""The whole loop on the real engine: traffic, feedback, harness evolution, gate, release, hot-swap.

A scripted user wants every answer to end with a sign-off line the base model never writes. It
talks to `reef serve` (with the harness_evolve recipe and its hindsight proposer) and, for each
answer that lacks the sign-off, reports a score of 0 with the answer it wanted written out (a
demonstration). The learning worker, a separate process started by the server, turns those into
worked examples in a harness candidate, the gate evaluates it on the server's engine, and the
server switches to the release: the next call is served under it, with the examples in front of
the prompt the model reads.

Every step is by construction, whatever the model samples on this machine: the demonstrations are
the user's, and the gate's floor of 0 releases whatever the evaluation scored. Whether the model
then signs off more often is a learning outcome, measured by `bench/learning/learning_curve.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from llama_cpp import Llama

from reef.engines.llamacpp import embedded_model_path
from reef.testing.processes import free_port, reef_serve
from tests.conftest import TOKEN

SIGN_OFF = "Cheers, Reef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# The first is held out (gate.held_out, by its words): the gate judges on it, the recipe learns
# from the other three.
TRAINING = ["What is the capital of France?", "Name an animal.", "What is 2+2?", "Name a tree."]
EVALS = ["What colour is grass?", "Name a planet.", "What is 3+3?"]
HELD_OUT = ["What is the capital of Italy?", "Name a fruit.", "What is 5+5?", "Name a colour."]
CONFIG = f"""
engine:
  llamacpp: {{n_ctx: 2048, n_threads: 2}}
gate:
  policy: floor
  floor: 0.0
  max_tokens: 48
  groups: {{feedback: {{rule: any}}}}  # one held-out prompt: the mechanics are tested here
learning:
  recipe: harness_evolve
  mode: auto
  interval_s: 0.5
  proposer: hindsight
  batch_size: 3
  scorer: {{type: regex, pattern: "{SIGN_OFF}\\\\s*$"}}
"""


def wanted(answer: str) -> str:
    """The answer the scripted user wanted: the one it got, with the sign-off line."""
    return f"{answer.strip()}\n{SIGN_OFF}"


def detokenize(ids: list[int]) -> str:
    vocab = Llama(model_path=str(embedded_model_path()), vocab_only=True, verbose=False)
    return bytes(vocab.detokenize(ids, special=True)).decode(errors="replace")


def ask(url: str, prompt: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    response.raise_for_status()
    return response


def records_of(url: str) -> list[dict]:
    response = httpx.get(f"{url}/reef/records", params={"limit": 100}, headers=HEADERS)
    return response.json()["data"]


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
        for prompt in HELD_OUT:  # traffic the worker has nothing to learn from
            assert ask(server.url, prompt).headers["x-reef-release-id"] == "base"

        demonstrated = {}
        for prompt in TRAINING:  # the scripted user writes out the answer it wanted
            response = ask(server.url, prompt)
            answer = response.json()["choices"][0]["message"]["content"]
            demonstrated[prompt] = wanted(answer)
            report = {
                "references": [response.headers["x-reef-agent-record-id"]],
                "score": 0,
                "feedback": {"demonstration": demonstrated[prompt]},
            }
            httpx.post(f"{server.url}/reef/report", json=report, headers=HEADERS).raise_for_status()

        deadline = time.monotonic() + 180
        while True:
            status = httpx.get(f"{server.url}/reef/status", headers=HEADERS).json()
            if status["serving"].get("default", "base") != "base":
                break
            last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
            assert last.get("outcome") not in ("rejected", "held", "error", "no proposal"), last
            assert time.monotonic() < deadline, f"no release: {status['learning']}\n{server.log()}"
            time.sleep(1)

        # One model per machine: the worker evaluated on the server's engine, whose model only
        # the server maps, and its evaluations were not recorded as traffic.
        tree = {server.process.pid, *worker_pids}
        assert processes_mapping(tree, ".gguf") == {server.process.pid}
        records = status["store"]["scenarios"]["default"]["records"]
        assert records == len(HELD_OUT) + len(TRAINING), status["store"]
        learning = status["learning"]["scenarios"]["default"]
        assert learning["last_step"]["outcome"] == "released"
        assert learning["batches_built"] == 1
        candidates = httpx.get(
            f"{server.url}/reef/scenarios/default/candidates", headers=HEADERS
        ).json()["data"]
        learned = {p: a for p, a in demonstrated.items() if p != TRAINING[0]}  # one held out
        trained_on = {
            r["id"]
            for r in records_of(server.url)
            if r["reports"] and r["request"]["messages"][-1]["content"] in learned
        }
        assert set(candidates[0]["consumed_record_ids"]) == trained_on  # the feedback's records
        judged = [t["task_id"] for t in candidates[0]["evaluation"]["results"]]
        assert any(task.startswith("held-out:") for task in judged)  # the held-out prompt

        releases = httpx.get(
            f"{server.url}/reef/scenarios/default/releases", headers=HEADERS
        ).json()
        assert "examples.jsonl" in releases["data"][0]["reason"]
        assert SIGN_OFF in releases["data"][0]["diff"]  # released with its diff
        harness = httpx.get(f"{server.url}/reef/harness", headers=HEADERS).json()
        examples = [json.loads(line) for line in harness["files"]["examples.jsonl"].splitlines()]
        assert {(e["user"], e["assistant"]) for e in examples} == set(learned.items())

        # The server switched without a restart: the next call is served under the release,
        # and the model read the user's worked examples in front of the question.
        served = ask(server.url, HELD_OUT[0])
        assert served.headers["x-reef-release-id"] == releases["data"][0]["release_id"]
        record_id = served.headers["x-reef-agent-record-id"]
        record = httpx.get(f"{server.url}/reef/records/{record_id}", headers=HEADERS).json()
        prompt_text = detokenize(record["prompt_token_ids"])
        assert all(answer in prompt_text for answer in learned.values())
        assert prompt_text.rstrip().endswith("assistant") and HELD_OUT[0] in prompt_text
    for pid in worker_pids:  # Ctrl-C stopped the worker too
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
