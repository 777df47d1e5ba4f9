"""Bytes in, bytes out: Reef in front of an upstream forwards the client's body as it was sent and
answers with the upstream's body as it came, unless a harness changes the request.

A small upstream, served by uvicorn on loopback in this process, keeps the exact bytes of the last
request it received and answers every chat request with one fixed body, pretty-printed and with a
`\\u00e9` escape, which no JSON library would write again byte for byte.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from starlette.requests import Request
from starlette.responses import Response

from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from reef.testing.threaded import chat_upstream
from tests.conftest import TOKEN

HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
ANSWER = {
    "id": "chatcmpl-bytes",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "bytes-peer",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Caf\u00e9 au lait."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
    "vendor_extra": {"kept": True},
}
# Pretty-printed, non-ASCII escaped: what the upstream sends, and so what the client must get.
ANSWER_BYTES = json.dumps(ANSWER, indent=2, ensure_ascii=True).encode()
# Key order, spacing, an escape and an unknown field that a re-serialised body would change.
SENT = (
    b'{ "messages" : [ {"content": "Caf\\u00e9?", "role": "user"} ],\n'
    b'  "model": "bytes-peer", "temperature": 0.50, "vendor_option": {"z": 1, "a": 2} }'
)
seen: dict[str, Any] = {}


async def completions(request: Request) -> Response:
    seen["body"] = await request.body()
    return Response(ANSWER_BYTES, media_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The upstream's base URL (ending in /v1), served from a thread of this process."""
    with chat_upstream(completions, "bytes-peer", "the upstream") as url:
        yield url


@pytest.fixture(scope="module")
def reef(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("reef-bytes")
    (folder / "reef.yaml").write_text("gate:\n  policy: always\n")
    server = reef_serve(
        folder, free_port(), "--engine", "upstream", "--upstream-url", upstream,
        env={"REEF_TOKEN": TOKEN},
    )  # fmt: skip
    with server.start():
        yield server


def record(reef: ServerProcess, receipt: str) -> dict[str, Any]:
    return httpx.get(f"{reef.url}/reef/records/{receipt}", headers=HEADERS).json()


def test_the_clients_bytes_go_upstream_and_the_upstreams_come_back(reef: ServerProcess) -> None:
    answer = httpx.post(f"{reef.url}/v1/chat/completions", content=SENT, headers=HEADERS)
    assert answer.status_code == 200
    assert seen["body"] == SENT
    assert answer.content == ANSWER_BYTES
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["content-length"] == str(len(ANSWER_BYTES))
    assert answer.headers["x-reef-release-id"] == "base"
    stored = record(reef, answer.headers["x-reef-agent-record-id"])
    assert stored["request"] == json.loads(SENT)
    assert stored["response"] == ANSWER
    assert stored["usage"] == ANSWER["usage"]
    assert (stored["prompt_tokens"], stored["completion_tokens"]) == (7, 4)
    assert (stored["model"], stored["engine"]) == ("bytes-peer", "upstream")
    assert stored["stream"] is False
    assert stored["latency_ms"] > 0


def test_the_openai_client_reads_the_relayed_answer(reef: ServerProcess) -> None:
    client = OpenAI(base_url=reef.url + "/v1", api_key=TOKEN, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="bytes-peer", messages=[{"role": "user", "content": "Café?"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Café au lait."
    assert completion.usage is not None and completion.usage.total_tokens == 11
    assert json.loads(seen["body"]) == {
        "model": "bytes-peer",
        "messages": [{"role": "user", "content": "Café?"}],
    }
    assert record(reef, raw.headers["x-reef-agent-record-id"])["response"] == ANSWER


def test_values_validation_coerced_go_upstream_coerced(reef: ServerProcess) -> None:
    sent = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5", "seed": "7"}'
    answer = httpx.post(f"{reef.url}/v1/chat/completions", content=sent, headers=HEADERS)
    assert answer.status_code == 200
    forwarded = json.loads(seen["body"])
    assert (forwarded["max_tokens"], forwarded["seed"]) == (5, 7)
    stored = record(reef, answer.headers["x-reef-agent-record-id"])
    assert stored["request"] == json.loads(sent)  # the record keeps what the client sent


def test_a_harness_still_applies_and_the_record_keeps_what_the_client_sent(
    reef: ServerProcess, tmp_path: Path
) -> None:
    folder = harness(tmp_path / "h", "Answer in French.")
    published = run_reef(Path(reef.cwd), "release", "publish", str(folder), "--kind", "harness")
    assert published.returncode == 0, published.stderr
    for _ in range(100):
        status = httpx.get(f"{reef.url}/reef/status", headers=HEADERS).json()
        if status["serving"].get("default"):
            break
        time.sleep(0.1)
    answer = httpx.post(f"{reef.url}/v1/chat/completions", content=SENT, headers=HEADERS)
    forwarded = json.loads(seen["body"])
    assert forwarded["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert forwarded["messages"][1:] == json.loads(SENT)["messages"]
    assert forwarded["vendor_option"] == {"z": 1, "a": 2}
    assert answer.content == ANSWER_BYTES
    stored = record(reef, answer.headers["x-reef-agent-record-id"])
    assert stored["request"] == json.loads(SENT)
    assert stored["release_id"] == answer.headers["x-reef-release-id"] != "base"
