"""Requests of the coding agents' own shape, recorded from the real agents run against Reef
(tests/agent_requests/: Codex 0.171 on /v1/responses, Claude Code 2.1.197 on /v1/messages,
opencode 1.18.33 on /v1/chat/completions; long texts trimmed to 300 characters, ids zeroed),
replayed against a real server on the embedded model. Each answer is checked against the SDK
types the agents' protocols are defined by, and each record against what the agent sent.

These run where the agents themselves cannot (tests/harness/test_agent_adapters.py runs them for
real).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic.types
import httpx
import openai.types.chat
import openai.types.responses
import pytest
from pydantic import TypeAdapter

from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN


@pytest.fixture
def http(llama_server: ServerProcess) -> Iterator[httpx.Client]:
    """A client that waits minutes: these prompts are the agents' (hundreds of tokens)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=llama_server.url, headers=headers, timeout=600) as session:
        yield session


RECORDED = Path(__file__).parent / "agent_requests"


def recorded(name: str) -> dict[str, Any]:
    shape: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return shape


def replayed(http: httpx.Client, shape: dict[str, Any], **changes: Any) -> list[dict[str, Any]]:
    """The recorded request sent again (with `changes`), its server-sent events as dicts."""
    url = shape["path"] + (f"?{shape['query']}" if shape["query"] else "")
    body = {**shape["body"], **changes}
    with http.stream("POST", url, json=body, headers=shape["headers"]) as response:
        assert response.status_code == 200, response.read().decode()
        text = "".join(response.iter_text())
    events = []
    for frame in text.split("\n\n"):
        data = [line[6:] for line in frame.split("\n") if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            events.append(json.loads(data[0]))
    return events


def stored(http: httpx.Client, record_id: str) -> dict[str, Any]:
    record: dict[str, Any] = http.get(f"/reef/records/{record_id}").json()
    return record


def test_codex_request_streams_events_the_openai_sdk_types_accept(http: httpx.Client) -> None:
    shape = recorded("codex-responses")
    body = shape["body"]
    assert body["store"] is False and "client_metadata" in body  # what Codex sends, kept
    events = replayed(http, shape, max_output_tokens=8)
    typed = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for event in events:
        typed.validate_python({k: v for k, v in event.items() if k != "reef"})
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = openai.types.responses.Response.model_validate(events[-1]["response"])
    assert final.store is False and final.output and final.output[0].type == "message"
    record = stored(http, events[-1]["reef"]["agent_record_id"])
    request = record["request"]
    # Developer messages stay in order; Codex's web_search is not offered (nothing runs it),
    # and the functions of its namespace tool are offered beside its plain functions.
    assert [m["role"] for m in request["messages"]] == ["developer", "developer", "user", "user"]
    assert request["responses_api"]["tools_not_offered"] == ["web_search"]
    namespace = next(tool for tool in body["tools"] if tool["type"] == "namespace")
    plain = [tool["name"] for tool in body["tools"] if tool["type"] == "function"]
    inner = [tool["name"] for tool in namespace["tools"] if tool["type"] == "function"]
    assert [tool["function"]["name"] for tool in request["tools"]] == plain[:4] + inner + plain[4:]


def test_claude_code_request_streams_events_the_anthropic_sdk_types_accept(
    http: httpx.Client,
) -> None:
    shape = recorded("claude-messages")
    body = shape["body"]
    assert body["thinking"] == {"type": "adaptive"} and "context_management" in body
    assert "output_config" in body and body["messages"][1]["role"] == "system"
    events = replayed(http, shape, max_tokens=8)
    typed = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            typed.validate_python(event)
    names = [event["type"] for event in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    (ping,) = [event for event in events if event["type"] == "ping"]
    request = stored(http, ping["reef"]["agent_record_id"])["request"]
    # A system message mid-conversation stays where Claude Code put it.
    roles = [m["role"] for m in request["messages"]]
    assert roles == ["system", "user", "system", "assistant", "user", "assistant", "user"]
    assert len(request["tools"]) == len(body["tools"])


def test_claude_code_request_whole_is_a_message(http: httpx.Client) -> None:
    shape = recorded("claude-messages")
    url = shape["path"] + f"?{shape['query']}"
    body = {**shape["body"], "stream": False, "max_tokens": 8}
    response = http.post(url, json=body, headers=shape["headers"])
    assert response.status_code == 200, response.text
    message = anthropic.types.Message.model_validate(response.json())
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens > 0


def test_opencode_request_streams_chunks_the_openai_sdk_types_accept(http: httpx.Client) -> None:
    shape = recorded("opencode-chat")
    events = replayed(http, shape, max_tokens=8)
    for event in events:
        openai.types.chat.ChatCompletionChunk.model_validate(event)
    assert events[-2]["usage"]["completion_tokens"] > 0  # stream_options.include_usage
    request = stored(http, events[-1]["reef"]["agent_record_id"])["request"]
    assert request["tools"] == shape["body"]["tools"] and request["tool_choice"] == "auto"
