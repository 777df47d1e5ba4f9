"""Records keep the prompt exactly as the model read it, and the sampling settings it was answered
with: training learns from what was served."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from llama_cpp import Llama

from reef.engines.llamacpp import embedded_model_path
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, write_config


def detokenize(ids: list[int]) -> str:
    vocab = Llama(model_path=str(embedded_model_path()), vocab_only=True, verbose=False)
    return bytes(vocab.detokenize(ids, special=True)).decode(errors="replace")


def ask(server: ServerProcess, text: str) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    record_id = reply.headers["x-reef-agent-record-id"]
    return httpx.get(f"{server.url}/reef/records/{record_id}").json()


def test_the_record_holds_the_served_prompt_with_its_harness(tmp_path: Path) -> None:
    write_config(tmp_path, SMALL_ENGINE + "gate:\n  policy: always\n")
    with reef_serve(tmp_path, free_port()).start() as server:
        plain = ask(server, "Name a bird.")
        assert len(plain["prompt_token_ids"]) == plain["usage"]["prompt_tokens"]
        assert "Name a bird." in detokenize(plain["prompt_token_ids"])
        # The request set only max_tokens: the record says what the answer was drawn with.
        sampling = plain["sampling"]
        assert (sampling["temperature"], sampling["top_p"]) == (1.0, 1.0)
        assert (sampling["top_k"], sampling["min_p"], sampling["max_tokens"]) == (40, 0.05, 4)
        assert isinstance(sampling["seed"], int)

        folder = harness(tmp_path / "h", "You always answer like a pirate.")
        published = run_reef(tmp_path, "release", "publish", str(folder), "--kind", "harness")
        assert published.returncode == 0, published.stderr
        for _ in range(50):
            if httpx.get(f"{server.url}/reef/status").json()["serving"].get("default"):
                break
            time.sleep(0.2)
        served = ask(server, "Name a bird.")
        prompt = detokenize(served["prompt_token_ids"])
        # The client sent one message; the model read the harness's prompt in front of it.
        assert served["request"]["messages"] == [{"role": "user", "content": "Name a bird."}]
        assert "like a pirate" in prompt and "Name a bird." in prompt
        assert len(served["prompt_token_ids"]) == served["usage"]["prompt_tokens"]
