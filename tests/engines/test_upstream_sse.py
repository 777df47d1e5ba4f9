"""Server-sent events from an upstream, written every way the SSE rules allow.

A small upstream, served by uvicorn on loopback in this process, streams the same chat chunks in
several spellings of the protocol, chosen by the request's model:

- `multiline`: each chunk's JSON over several `data:` lines, with `:` comments, `id:` and
  `retry:` fields, a named `ping` event carrying data that is not a chunk, and `\\r\\n` endings;
- `bare-cr`: plain one-line events, each line ending in a lone `\\r`;
- `error-event`: one chunk, then `event: error` with the upstream's complaint;
- `not-sse`: a stream request answered with a whole JSON body.

The upstream engine must read the same chunks from each, and `reef serve` in front of it must
stream and record the whole answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from reef.engines.upstream import UpstreamEngine
from reef.errors import UpstreamFailure
from reef.protocol import ChatRequest, Completion
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream
from tests.conftest import TOKEN

WORDS = ["one ", "two ", "three"]
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-sse",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "sse-peer",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def chunks() -> list[dict[str, Any]]:
    first = chunk({"role": "assistant", "content": ""})
    return [first, *(chunk({"content": word}) for word in WORDS), chunk({}, "stop")]


def multiline_events() -> Iterator[str]:
    """Every chunk pretty-printed over several `data:` lines, among what a reader must skip."""
    yield ": this upstream says hello\r\n\r\n"
    yield "retry: 3000\r\n\r\n"
    for number, item in enumerate(chunks()):
        yield ": keep-alive\r\n"
        yield 'event: ping\r\ndata: {"type": "ping"}\r\n\r\n'
        lines = json.dumps(item, indent=2).splitlines()
        yield f"id: {number}\r\n" + "".join(f"data: {line}\r\n" for line in lines) + "\r\n"
    yield "data: [DONE]\r\n\r\n"


def bare_cr_events() -> Iterator[str]:
    for item in chunks():
        yield f"data: {json.dumps(item)}\r\r"
    yield "data: [DONE]\r\r"


def error_events() -> Iterator[str]:
    yield f"data: {json.dumps(chunks()[0])}\n\n"
    yield 'event: error\ndata: {"message": "the upstream model is overloaded"}\n\n'


EVENTS = {"multiline": multiline_events, "bare-cr": bare_cr_events, "error-event": error_events}


async def completions(request: Request) -> Response:
    model = (await request.json()).get("model")
    if model == "not-sse":
        return JSONResponse({"object": "chat.completion", "choices": []})

    async def body() -> AsyncIterator[bytes]:
        for text in EVENTS[model]():
            yield text.encode()
            await asyncio.sleep(0)  # one write per event, as a real stream arrives

    return StreamingResponse(body(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The SSE upstream's base URL (ending in /v1), served from a thread of this process."""
    with chat_upstream(completions, "sse-peer", "the SSE upstream") as url:
        yield url


def stream_through_engine(url: str, model: str) -> list[Any]:
    async def run() -> list[Any]:
        engine = UpstreamEngine(url)
        await engine.start()
        try:
            request = ChatRequest(model=model, messages=[{"role": "user", "content": "count"}])
            return [item async for item in engine.stream(request)]
        finally:
            await engine.close()

    return asyncio.run(run())


@pytest.mark.parametrize("model", ["multiline", "bare-cr"])
def test_engine_reads_the_same_chunks_however_the_stream_is_written(
    upstream: str, model: str
) -> None:
    *streamed, completion = stream_through_engine(upstream, model)
    assert streamed == chunks()
    assert isinstance(completion, Completion)
    assert completion.response["choices"][0]["message"]["content"] == "".join(WORDS)


def test_an_error_event_is_the_upstream_failing(upstream: str) -> None:
    with pytest.raises(UpstreamFailure) as failure:
        stream_through_engine(upstream, "error-event")
    assert failure.value.message == "upstream failed mid-stream: the upstream model is overloaded"


def test_a_stream_answered_without_sse_is_a_clear_failure(upstream: str) -> None:
    with pytest.raises(UpstreamFailure, match=r"without SSE.*application/json"):
        stream_through_engine(upstream, "not-sse")


@pytest.fixture(scope="module")
def reef(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("reef-sse")
    server = reef_serve(
        folder,
        free_port(),
        "--engine",
        "upstream",
        "--upstream-url",
        upstream,
        env={"REEF_TOKEN": TOKEN},
    )
    with server.start():
        yield server


def test_reef_streams_and_records_a_multiline_stream(reef: ServerProcess) -> None:
    client = OpenAI(base_url=reef.url + "/v1", api_key=TOKEN, max_retries=0)
    received = list(
        client.chat.completions.create(
            model="multiline", messages=[{"role": "user", "content": "count"}], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert text == "".join(WORDS)
    receipt = received[-1].model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    stored = httpx.get(f"{reef.url}/reef/records/{receipt}", headers=HEADERS).json()
    assert stored["response"]["choices"][0]["message"]["content"] == text


def test_reef_relays_an_error_event_and_stores_nothing(reef: ServerProcess) -> None:
    client = OpenAI(base_url=reef.url + "/v1", api_key=TOKEN, max_retries=0)
    before = httpx.get(f"{reef.url}/reef/status", headers=HEADERS).json()["store"]
    with pytest.raises(openai.APIError, match="overloaded"):
        list(
            client.chat.completions.create(
                model="error-event", messages=[{"role": "user", "content": "count"}], stream=True
            )
        )
    after = httpx.get(f"{reef.url}/reef/status", headers=HEADERS).json()["store"]
    assert after["scenarios"] == before["scenarios"]
