"""`POST /v1/responses` through the real `openai` SDK against a real server on the embedded model:
whole and streamed, instructions, forced function calls and their outputs, previous_response_id
chaining from the store, receipts and records (the translated chat request), and refusals in the
Responses error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import openai.types.responses
import pytest
from openai import OpenAI

from reef.testing.processes import ServerProcess
from tests.conftest import GRAMMAR_ROOM

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FORCE_WEATHER: Any = {"type": "function", "name": "get_weather"}
ASK_WEATHER = "What is the weather in Paris?"


def record_of(http: httpx.Client, response_id: str) -> dict[str, Any]:
    record = http.get(f"/reef/records/rec_{response_id.removeprefix('resp_')}")
    assert record.status_code == 200, record.text
    return record.json()


def record_count(http: httpx.Client) -> int:
    return len(http.get("/reef/records", params={"limit": 1000}).json()["data"])


def test_a_whole_response_with_instructions_is_answered_and_recorded(
    client: OpenAI, http: httpx.Client
) -> None:
    raw = client.responses.with_raw_response.create(
        model="default",
        instructions="You are terse.",
        input="Say hello.",
        max_output_tokens=16,
        temperature=0,
    )
    response = raw.parse()
    # Strictly the SDK's type (parse() is lenient): every required field is there.
    openai.types.responses.Response.model_validate(json.loads(raw.text))
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.output[0].type == "message"
    assert response.instructions == "You are terse."
    assert response.usage is not None and response.usage.input_tokens > 0
    assert 0 < response.usage.output_tokens <= 16
    receipt = raw.headers["x-reef-agent-record-id"]
    assert receipt == "rec_" + response.id.removeprefix("resp_")  # the id names the record
    record = record_of(http, response.id)
    assert record["request"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    assert record["request"]["max_tokens"] == 16 and record["stream"] is False
    assert record["response"]["choices"][0]["message"]["content"] == response.output_text


def test_a_streamed_response_adds_up_and_carries_its_receipt_in_the_last_event(
    client: OpenAI, http: httpx.Client
) -> None:
    # Short enough to finish within the limit (one cut short ends in response.incomplete).
    with client.responses.stream(
        model="default", input="Say hello.", max_output_tokens=64, temperature=0
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens > 0
    # The raw events: typed, named, numbered in order, the receipt in response.completed.
    body = {"model": "default", "input": "Count to five.", "stream": True, "max_output_tokens": 16}
    with http.stream("POST", "/v1/responses", json=body) as response:
        frames = "".join(response.iter_text()).split("\n\n")
    events = [
        (frame.split("\n")[0].removeprefix("event: "), json.loads(frame.split("\n")[1][6:]))
        for frame in frames
        if frame.strip()
    ]
    names = [name for name, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if names[-1] == "response.completed" else "response.incomplete",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    last = events[-1][1]
    record = http.get(f"/reef/records/{last['reef']['agent_record_id']}").json()
    assert record["id"] == "rec_" + last["response"]["id"].removeprefix("resp_")
    assert record["stream"] is True
    text = "".join(data["delta"] for name, data in events if name.endswith("output_text.delta"))
    assert record["response"]["choices"][0]["message"]["content"] == text
    assert last["response"]["output"][0]["content"][0]["text"] == text


def test_a_forced_function_call_is_valid_against_its_schema(
    client: OpenAI, http: httpx.Client
) -> None:
    response = client.responses.create(
        model="default",
        input=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        max_output_tokens=GRAMMAR_ROOM,
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    request = record_of(http, response.id)["request"]
    assert request["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert request["tools"][0]["function"]["parameters"] == WEATHER["parameters"]


def test_a_forced_function_call_streams_its_arguments(client: OpenAI) -> None:
    with client.responses.stream(
        model="default",
        input=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        max_output_tokens=GRAMMAR_ROOM,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_a_function_call_output_round_trip_ends_in_text(client: OpenAI, http: httpx.Client) -> None:
    first = client.responses.create(
        model="default",
        input=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        max_output_tokens=GRAMMAR_ROOM,
    )
    call = next(item for item in first.output if item.type == "function_call")
    items: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": ASK_WEATHER}]},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    second = client.responses.create(
        model="default", input=items, tools=[WEATHER], max_output_tokens=16
    )
    assert second.output_text and second.output[0].type == "message"
    messages = record_of(http, second.id)["request"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == call.arguments
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"}


def test_previous_response_id_chains_the_stored_conversation(
    client: OpenAI, http: httpx.Client
) -> None:
    first = client.responses.create(
        model="default",
        instructions="You are terse.",
        input="My name is Ada.",
        max_output_tokens=8,
        extra_headers={"x-reef-session": "responses-chain"},
    )
    second = client.responses.create(
        model="default",
        instructions="You are kind.",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id
    record = record_of(http, second.id)
    # The earlier input and answer come first; the earlier instructions do not carry over.
    assert record["request"]["messages"] == [
        {"role": "system", "content": "You are kind."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    assert record["session"] == "responses-chain"  # a chained call continues its session
    # A streamed response chains too (its last event is completed or incomplete).
    events = list(
        client.responses.create(
            model="default",
            previous_response_id=second.id,
            input="Thanks.",
            max_output_tokens=8,
            stream=True,
        )
    )
    third = events[-1].response  # type: ignore[union-attr]
    roles = [m["role"] for m in record_of(http, third.id)["request"]["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]


def test_an_unknown_previous_response_id_is_404_in_the_responses_shape(
    client: OpenAI, http: httpx.Client
) -> None:
    before = record_count(http)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(
            model="default", previous_response_id="resp_000000000000_000000000000", input="Hi"
        )
    error = refused.value.body
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"
    assert "resp_000000000000_000000000000" in error["message"]
    assert record_count(http) == before


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({}, "input", "input: required"),
        ({"input": []}, "input", "send some input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "'input_image' part",
        ),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice", "needs function `tools`"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning' item"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation", "unknown field"),
        ({"input": "Hi", "background": True}, "background", "False"),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role", "'user'"),
        (
            {"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
            "tool_choice",
            "not one of `tools`",
        ),
    ],
)
def test_bad_requests_are_400_in_the_responses_shape_and_store_nothing(
    http: httpx.Client, body: dict[str, Any], param: str | None, says: str
) -> None:
    before = record_count(http)
    response = http.post("/v1/responses", json={"model": "default", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says in error["message"]
    assert record_count(http) == before


def test_the_sdk_raises_bad_request_with_the_param(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="default", input="Hi", temperature=3)
    assert refused.value.param == "temperature"  # type: ignore[attr-defined]


def test_a_wrong_token_is_401(llama_server: ServerProcess) -> None:
    wrong = OpenAI(base_url=llama_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model="default", input="Hi")
