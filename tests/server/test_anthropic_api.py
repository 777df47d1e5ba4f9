"""`POST /v1/messages` through the real `anthropic` SDK against a real server on the embedded
model: whole and streamed, system prompts, forced tool calls and tool results, receipts and the
record (the translated chat request), x-api-key auth, and refusals in Anthropic's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from reef.server.messages.translate import anthropic_message
from reef.testing.processes import ServerProcess
from tests.conftest import GRAMMAR_ROOM, TOKEN

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FORCE_WEATHER: Any = {"type": "tool", "name": "get_weather"}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def claude(llama_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=llama_server.url, api_key=TOKEN, max_retries=0)


@pytest.fixture
def http(llama_server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=llama_server.url, headers=headers, timeout=60) as session:
        yield session


def record_count(http: httpx.Client) -> int:
    return len(http.get("/reef/records", params={"limit": 1000}).json()["data"])


def test_a_whole_message_with_a_system_prompt_is_answered_and_recorded(
    claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    raw = claude.messages.with_raw_response.create(
        model="default",
        max_tokens=16,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body={"temperature": 0},
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content and message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 16
    record = http.get(f"/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert record["request"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    assert record["request"]["max_tokens"] == 16 and record["stream"] is False
    assert record["response"]["object"] == "chat.completion"
    assert record["response"]["choices"][0]["message"]["content"] == message.content[0].text


def test_a_streamed_message_adds_up_and_carries_its_receipt_in_a_ping(
    claude: anthropic.Anthropic, http: httpx.Client, llama_server: ServerProcess
) -> None:
    with claude.messages.stream(
        model="default",
        max_tokens=16,
        system="You are terse.",
        messages=[{"role": "user", "content": "Count to five."}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0
    # The raw events: named, in Anthropic's order, with the receipt in a ping before the end.
    body = {
        "model": "default",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "Count to five."}],
    }
    with http.stream("POST", "/v1/messages", json=body) as response:
        lines = "".join(response.iter_text()).split("\n\n")
    events = [
        (part.split("\n")[0].removeprefix("event: "), json.loads(part.split("\n")[1][6:]))
        for part in lines
        if part.strip()
    ]
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and "content_block_delta" in names
    assert names.index("content_block_stop") < names.index("ping") < names.index("message_stop")
    assert all(data["type"] == name for name, data in events)
    receipt = dict(events)["ping"]["reef"]["agent_record_id"]
    record = http.get(f"/reef/records/{receipt}").json()
    assert record["stream"] is True and record["request"]["stream"] is True
    # message_start says the prompt's tokens, as the whole answer and count_tokens do (issue 75).
    started = dict(events)["message_start"]["message"]["usage"]
    assert started["input_tokens"] == record["prompt_tokens"] > 0
    assert started["cache_read_input_tokens"] == started["cache_creation_input_tokens"] == 0
    streamed = "".join(
        data["delta"]["text"] for name, data in events if name == "content_block_delta"
    )
    assert record["response"]["choices"][0]["message"]["content"] == streamed


def test_a_forced_tool_call_is_a_tool_use_block_valid_against_its_schema(
    claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    raw = claude.messages.with_raw_response.create(
        model="default",
        max_tokens=GRAMMAR_ROOM,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
    )
    message = raw.parse()
    assert message.stop_reason == "tool_use"
    (block,) = [block for block in message.content if block.type == "tool_use"]
    assert block.name == "get_weather" and block.id
    jsonschema.validate(block.input, WEATHER["input_schema"])
    record = http.get(f"/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert record["request"]["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert record["request"]["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]


def test_a_forced_tool_call_streams_as_input_json_deltas(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="default",
        max_tokens=GRAMMAR_ROOM,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds
    assert final.stop_reason == "tool_use"
    (block,) = [block for block in final.content if block.type == "tool_use"]
    assert block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER["input_schema"])


def test_a_tool_result_round_trip_ends_in_text(
    claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    first = claude.messages.create(
        model="default",
        max_tokens=GRAMMAR_ROOM,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
    )
    call = next(block for block in first.content if block.type == "tool_use")
    messages: Any = [
        *ASK_WEATHER,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"},
                {"type": "text", "text": "Answer in one sentence."},
            ],
        },
    ]
    raw = claude.messages.with_raw_response.create(
        model="default", max_tokens=16, messages=messages, tools=[WEATHER]
    )
    second = raw.parse()
    assert second.content and second.content[0].type == "text" and second.content[0].text
    assert second.stop_reason in ("end_turn", "max_tokens")
    request = http.get(f"/reef/records/{raw.headers['x-reef-agent-record-id']}").json()["request"]
    assert [message["role"] for message in request["messages"]] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assistant, tool = request["messages"][1], request["messages"][2]
    assert assistant["tool_calls"][0]["id"] == call.id
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == call.input
    assert tool == {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}


def test_x_api_key_is_accepted_and_a_wrong_key_refused_in_anthropic_shape(
    llama_server: ServerProcess,
) -> None:
    body = {"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    ok = httpx.post(
        llama_server.url + "/v1/messages", json=body, headers={"x-api-key": TOKEN}, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    wrong = anthropic.Anthropic(base_url=llama_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model="default", max_tokens=4, messages=body["messages"])
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": refused.value.body["error"]["message"],
        },
    }
    # Other routes keep OpenAI's shape, and take x-api-key too.
    other = httpx.get(llama_server.url + "/v1/models", headers={"x-api-key": "wrong"})
    assert other.status_code == 401 and other.json()["error"]["code"] == "invalid_token"
    assert httpx.get(llama_server.url + "/v1/models", headers={"x-api-key": TOKEN}).is_success


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "max_tokens: required"),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"data": "x"}}]}
                ],
            },
            "'image'",
        ),
        ({"max_tokens": 8, "messages": []}, "messages"),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hi"}],
                "tool_choice": {"type": "tool", "name": "nope"},
                "tools": [WEATHER],
            },
            "not one of `tools`",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hi"}],
                "thinking": {"type": "always"},  # not one of Anthropic's kinds
            },
            "thinking",
        ),
    ],
)
def test_bad_requests_are_400_in_anthropic_shape_and_store_nothing(
    http: httpx.Client, claude: anthropic.Anthropic, body: dict[str, Any], says: str
) -> None:
    before = record_count(http)
    response = http.post("/v1/messages", json={"model": "default", **body})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert says in error["error"]["message"]
    assert record_count(http) == before


def test_the_sdk_raises_bad_request_for_a_missing_max_tokens(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model="default",
            max_tokens=16,
            messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}],  # type: ignore[list-item]
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_a_stop_sequence_the_engine_names_is_the_stop_reason() -> None:
    # vLLM (and upstreams built on it) name the stop string that matched in `stop_reason`;
    # llama.cpp does not, and an end-of-sequence token is vLLM's null (or a token id).
    def answer(**choice: Any) -> dict[str, Any]:
        base = {"index": 0, "message": {"role": "assistant", "content": "1, 2"}}
        return anthropic_message(
            {"id": "chatcmpl-1", "model": "m", "choices": [{**base, **choice}]}
        )

    named = answer(finish_reason="stop", stop_reason=", 3")
    assert (named["stop_reason"], named["stop_sequence"]) == ("stop_sequence", ", 3")
    for unnamed in (answer(finish_reason="stop"), answer(finish_reason="stop", stop_reason=2)):
        assert (unnamed["stop_reason"], unnamed["stop_sequence"]) == ("end_turn", None)
    cut = answer(finish_reason="length", stop_reason=None)
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("max_tokens", None)


def test_usage_has_the_cache_fields_and_thinking_enabled_is_accepted(
    claude: anthropic.Anthropic,
) -> None:
    """Issue 75: `usage` lacked the cache fields the SDK reads, and `thinking: {"type":
    "enabled"}` was refused. The served models have no thinking: no thinking block comes back."""
    message = claude.messages.create(
        model="default",
        max_tokens=8,
        messages=[{"role": "user", "content": "Say hi."}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0},
    )
    assert [block.type for block in message.content] == ["text"]
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.input_tokens > 0


def test_top_k_is_honoured(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    """Issue 75: `top_k` was refused although llama.cpp samples with it. With k = 1 a sampled
    answer is the greedy one, whatever the seed; the record says what it was drawn with."""
    ask: Any = [{"role": "user", "content": "Name a colour."}]
    greedy = claude.messages.create(
        model="default", max_tokens=12, messages=ask, extra_body={"temperature": 0}
    )
    raw = claude.messages.with_raw_response.create(
        model="default", max_tokens=12, messages=ask, extra_body={"temperature": 1, "top_k": 1}
    )
    sampled = raw.parse()
    assert sampled.content[0].text == greedy.content[0].text  # type: ignore[union-attr]
    record = http.get(f"/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert record["sampling"]["top_k"] == 1
