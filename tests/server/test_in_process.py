"""The in-process tier's own ground: `reef_in_process` serves the whole serve path from a thread
with a `ScriptedEngine`, and what the real clients see of it is what they see of `reef serve`
(answers cut at max_tokens and stop, streams, tool calls, receipts, records)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from reef.protocol import ChatRequest
from reef.testing.in_process import InProcessReef, reef_in_process
from reef.testing.scripted_engine import ScriptedEngine
from tests.conftest import TOKEN

WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
}


def script(request: ChatRequest) -> str | dict[str, object]:
    if request.tools:
        return {"content": None, "tool_calls": [WEATHER_CALL]}
    return "one two three four. five"


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    folder = tmp_path_factory.mktemp("in-process")
    with reef_in_process(folder, ScriptedEngine(script), env={"REEF_TOKEN": TOKEN}) as server:
        yield server


@pytest.fixture
def client(reef: InProcessReef) -> OpenAI:
    return OpenAI(base_url=reef.url + "/v1", api_key=TOKEN, max_retries=0)


def test_an_answer_is_cut_at_max_tokens_and_at_stop(client: OpenAI) -> None:
    hi = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model="m", messages=hi)  # type: ignore[arg-type]
    cut = client.chat.completions.create(model="m", messages=hi, max_tokens=2)  # type: ignore[arg-type]
    stopped = client.chat.completions.create(model="m", messages=hi, stop=".")  # type: ignore[arg-type]
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (
        "one two three four. five",
        "stop",
    )
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ("one two", "length")
    assert cut.usage is not None and cut.usage.completion_tokens == 2
    assert stopped.choices[0].message.content == "one two three four"


def test_a_stream_assembles_to_the_whole_answer_and_is_recorded(
    client: OpenAI, reef: InProcessReef
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "one two three four. five"
    receipt = chunks[-1].model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    record = httpx.get(
        f"{reef.url}/reef/records/{receipt}", headers={"authorization": f"Bearer {TOKEN}"}
    ).json()
    assert record["response"]["choices"][0]["message"]["content"] == text


def test_a_tool_call_is_answered_as_the_script_says(client: OpenAI, reef: InProcessReef) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    answer = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[tool],  # type: ignore[list-item]
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert answer.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    engine = reef.engine
    assert isinstance(engine, ScriptedEngine) and engine.calls[-1].request.tools


def test_the_server_file_is_written_while_it_serves(reef: InProcessReef) -> None:
    advertised = json.loads((reef.config.state_dir / "server.json").read_text())
    assert advertised["url"] == reef.url


def test_a_wrong_token_is_refused_before_the_engine_is_asked(reef: InProcessReef) -> None:
    engine = reef.engine
    assert isinstance(engine, ScriptedEngine)
    asked = len(engine.calls)
    refused = httpx.post(
        f"{reef.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer wrong"},
    )
    assert refused.status_code == 401
    assert "token" in refused.json()["error"]["message"]
    assert len(engine.calls) == asked


def test_it_stops_and_frees_its_port(tmp_path: Path) -> None:
    with reef_in_process(tmp_path) as reef:
        url = reef.url
        assert httpx.get(f"{url}/healthz").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)
