"""A checkpoint release (full weights) published to a running `reef serve` on the real llama.cpp
engine: loaded beside the model it serves, switched to without a restart, while a request in
flight finishes on the weights it started on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from reef.testing.artifacts import harness, random_checkpoint
from reef.testing.processes import free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, TOKEN, needs_git_lfs, write_config

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
SWITCH_BOUND_S = 30  # from the publish's return to a response under the new release
EOS = 2  # SmolLM2's <|im_end|>
HI = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
LONG = {
    "messages": [{"role": "user", "content": "Count to a hundred."}],
    "max_tokens": 96,
    "temperature": 0,
    "logit_bias": {str(EOS): -100},  # never ends early: runs to max_tokens
    "stream": True,
    "stream_options": {"include_usage": True},
}


def ask(url: str, body: dict) -> httpx.Response:
    response = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    response.raise_for_status()
    return response


def streamed(url: str, into: dict) -> None:
    """LONG, streamed: its release, its chunks' finish reason and its usage, into `into`."""
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=LONG, headers=HEADERS, timeout=120
    ) as response:
        into["release"] = response.headers["x-reef-release-id"]
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                into["tokens"] = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                into["finish"] = choice.get("finish_reason") or into.get("finish")


def publish(project: Path, folder: Path, kind: str, *flags: str) -> str:
    """`reef release publish FOLDER --kind KIND`, its output; it must succeed."""
    result = run_reef(project, "release", "publish", str(folder), "--kind", kind, *flags)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def until_release(url: str, release_id: str) -> dict:
    deadline = time.monotonic() + SWITCH_BOUND_S
    while (response := ask(url, HI)).headers["x-reef-release-id"] != release_id:
        assert time.monotonic() < deadline, f"{release_id} did not serve"
    return response.json()


def test_a_checkpoint_release_swaps_in_while_a_request_finishes_on_the_old_weights(
    tmp_path: Path,
) -> None:
    needs_git_lfs()
    write_config(tmp_path, SMALL_ENGINE + "gate:\n  policy: review\n")
    checkpoint = random_checkpoint(tmp_path / "merged")
    with reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        base = ask(server.url, HI).json()
        in_flight: dict = {}
        long = threading.Thread(target=streamed, args=(server.url, in_flight))
        long.start()
        publish(tmp_path, checkpoint, "checkpoint", "--approve")
        swapped = until_release(server.url, "default@1")
        long.join(timeout=120)

        assert in_flight == {"release": "base", "tokens": 96, "finish": "length"}
        answer = swapped["choices"][0]["message"]["content"]
        assert answer != base["choices"][0]["message"]["content"]  # other weights answer
        assert swapped["model"] == "default@1"  # the weights of that release
        engine = httpx.get(server.url + "/reef/status", headers=HEADERS).json()["engine"]
        assert engine["checkpoints"] == ["default@1"]
        shown = json.loads(run_reef(tmp_path, "release", "show", "default@1", "--json").stdout)
        assert shown["kind"] == "checkpoint" and shown["parts"] == ["checkpoint"]

        # A harness beside the weights: both serve, as one release.
        beside = harness(tmp_path / "both", "Answer in one word.")
        random_checkpoint(beside)
        publish(tmp_path, beside, "checkpoint", "--approve")
        both = until_release(server.url, "default@2")
        assert both["usage"]["prompt_tokens"] != swapped["usage"]["prompt_tokens"]  # its harness
        assert both["model"] == "default@2"
        # And back to the model it started with: the base's own answer again.
        publish(tmp_path, harness(tmp_path / "h", ""), "harness", "--approve")
        again = until_release(server.url, "default@3")
        assert again["choices"][0]["message"]["content"] == base["choices"][0]["message"]["content"]


def test_a_checkpoint_llama_cpp_cannot_load_never_serves(tmp_path: Path) -> None:
    needs_git_lfs()
    write_config(tmp_path, SMALL_ENGINE + "gate:\n  policy: no_regression\n")
    (tmp_path / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Hi"}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    (tmp_path / "evals" / "default.jsonl").write_text(json.dumps(task) + "\n")
    broken = tmp_path / "broken" / "checkpoint"
    broken.mkdir(parents=True)
    (broken / "model.gguf").write_bytes(b"GGUF not really")
    with reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        gated = run_reef(tmp_path, "release", "publish", str(broken.parent), "--kind", "checkpoint")
        said = gated.stdout + gated.stderr
        assert gated.returncode != 0 and "could not load the checkpoint" in said, said
        assert ask(server.url, HI).headers["x-reef-release-id"] == "base"
        # Forced past the gate, it heads the chain, and the server keeps serving what it served.
        publish(tmp_path, broken.parent, "checkpoint", "--approve")
        deadline = time.monotonic() + SWITCH_BOUND_S
        while not (
            errors := httpx.get(server.url + "/reef/status", headers=HEADERS).json()[
                "release_errors"
            ]
        ):
            assert time.monotonic() < deadline
        assert "default" in errors and "still serving base" in errors["default"]
        assert ask(server.url, HI).headers["x-reef-release-id"] == "base"
