"""Structured output on llama.cpp through the real server and the real `openai` client: JSON
answers shaped by `response_format`, and tool calls forced by `tool_choice`, whole and streamed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.conftest import GRAMMAR_ROOM, token_of

ASK = [{"role": "user", "content": "Describe the weather in Paris today."}]
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "celsius": {"type": "integer"},
        "sky": {"type": "string", "enum": ["sunny", "cloudy", "rainy"]},
    },
    "required": ["city", "celsius", "sky"],
    "additionalProperties": False,
}
WEATHER_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "weather", "strict": True, "schema": WEATHER_SCHEMA},
}
GET_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
GET_TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
FORCE_WEATHER: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_json_schema_answers_validate_against_the_schema(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="default", messages=ASK, response_format=WEATHER_FORMAT, max_tokens=GRAMMAR_ROOM
    )
    answer = raw.parse()
    content = answer.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), WEATHER_SCHEMA)
    assert answer.choices[0].finish_reason == "stop"
    assert raw.headers["x-reef-agent-record-id"].startswith("rec_")


def test_json_schema_streamed_adds_up_to_a_valid_answer(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="default",
        messages=ASK,
        response_format=WEATHER_FORMAT,
        max_tokens=GRAMMAR_ROOM,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), WEATHER_SCHEMA)


def test_json_object_answers_are_a_json_object(client: OpenAI) -> None:
    """Any object is an unbounded grammar, so no max_tokens is room enough for what the model may
    say: the test pushes the token that closes an object at once (`{}`), and the grammar holds
    the answer to one object, then ends it. A bias cannot leave the grammar: pushed harder, the
    token `}` (no object yet) is never chosen."""
    answer = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Reply in JSON: a colour and its hex code."}],
        response_format={"type": "json_object"},
        max_tokens=GRAMMAR_ROOM,
        temperature=0,
        logit_bias={token_of("{}"): 30, token_of("}"): 100},
    )
    assert answer.choices[0].finish_reason == "stop"
    assert json.loads(answer.choices[0].message.content or "") == {}


def test_the_sdk_parse_helper_reads_a_schema_shaped_answer(client: OpenAI) -> None:
    """`client.chat.completions.parse` sends a strict schema from a pydantic model."""
    from pydantic import BaseModel, Field

    class Colour(BaseModel):  # bounded, so the answer closes within GRAMMAR_ROOM
        name: str = Field(max_length=20)
        hex: str = Field(max_length=9)

    answer = client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": "Name a colour."}],
        response_format=Colour,
        max_tokens=GRAMMAR_ROOM,
        temperature=0,
    )
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Colour)


def test_a_named_tool_choice_returns_that_tool_call(client: OpenAI, http: httpx.Client) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="default",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[GET_WEATHER, GET_TIME],
        tool_choice=FORCE_WEATHER,
        max_tokens=GRAMMAR_ROOM,
    )
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), GET_WEATHER["function"]["parameters"])
    record = http.get(f"/reef/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert record["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == call.id


def test_required_tool_choice_calls_one_of_the_tools(client: OpenAI) -> None:
    answer = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What time is it in Berlin?"}],
        tools=[GET_WEATHER, GET_TIME],
        tool_choice="required",
        max_tokens=GRAMMAR_ROOM,
    )
    (call,) = answer.choices[0].message.tool_calls or []
    tools = {
        tool["function"]["name"]: tool["function"]["parameters"] for tool in (GET_WEATHER, GET_TIME)
    }
    assert call.function.name in tools
    jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])


def test_a_forced_tool_call_streams_as_tool_call_deltas(client: OpenAI, http: httpx.Client) -> None:
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[GET_WEATHER],
        tool_choice=FORCE_WEATHER,
        max_tokens=GRAMMAR_ROOM,
        stream=True,
    )
    name, arguments, finish, deltas, receipt = "", "", None, 0, None
    for chunk in stream:
        receipt = getattr(chunk, "reef", None) or receipt
        for choice in chunk.choices:
            assert not choice.delta.content
            for delta in choice.delta.tool_calls or []:
                deltas += 1
                name += (delta.function and delta.function.name) or ""
                arguments += (delta.function and delta.function.arguments) or ""
            finish = choice.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    assert deltas > 2  # the arguments arrive as they are generated, not in one piece
    jsonschema.validate(json.loads(arguments), GET_WEATHER["function"]["parameters"])
    assert receipt and receipt["agent_record_id"].startswith("rec_")
    record = http.get(f"/reef/records/{receipt['agent_record_id']}").json()
    stored = record["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert stored == {"name": "get_weather", "arguments": arguments}


def test_a_tool_round_trip_ends_in_a_text_answer(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.chat.completions.create(
        model="default",
        messages=messages,
        tools=[GET_WEATHER],
        tool_choice=FORCE_WEATHER,
        max_tokens=GRAMMAR_ROOM,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    second = client.chat.completions.create(
        model="default", messages=messages, tools=[GET_WEATHER], max_tokens=30, temperature=0
    )
    assert second.choices[0].message.content
    assert not second.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in `tools`"),
        ({"response_format": {"type": "yaml"}}, "'yaml' is not supported"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
            "must be a JSON schema object",
        ),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "cannot both shape one answer",
        ),
    ],
)
def test_shapes_that_cannot_be_honoured_are_refused(
    client: OpenAI, fields: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="default", messages=ASK, tools=[GET_WEATHER], max_tokens=5, **fields
        )
    assert says in str(caught.value.body)


def test_grammar_strings_refuse_raw_control_characters() -> None:
    """JSON strings may hold a newline or a tab only escaped. llama-cpp-python's converter allows
    them raw, and sampled tool arguments then failed to parse now and then; if its rule text
    changes, this says so instead of the fix silently doing nothing."""
    from reef.engines.llamacpp.structured import (
        JSON_STRING_CHAR,
        LOOSE_STRING_CHAR,
        _schema_grammar,
        _tool_call_grammar,
    )

    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    for grammar in (_schema_grammar(schema, "test"), _tool_call_grammar([("f", schema)])):
        assert JSON_STRING_CHAR in grammar and LOOSE_STRING_CHAR not in grammar
