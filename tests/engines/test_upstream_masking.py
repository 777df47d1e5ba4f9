"""An upstream URL's password and key never show: not in an error's JSON, not in a log line
(Reef's or its HTTP libraries', at debug), while the upstream still gets them (Basic
authentication from `user:password@`, the query on every route)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import httpx
import pytest

from reef.engines.upstream import UpstreamEngine
from reef.errors import UpstreamFailure
from reef.protocol import ChatRequest
from reef.testing.processes import ServerProcess, free_port
from reef.urls import without_password

SECRET = "secret"


def url_with_secrets(host: str) -> str:
    return f"http://user:{SECRET}@{host}/v1?api_key={SECRET}&api-version=2024-06-01"


def ask(model: str, stream: bool = False) -> ChatRequest:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return ChatRequest.model_validate(body)


async def failure(engine: UpstreamEngine, request: ChatRequest) -> UpstreamFailure:
    await engine.start()
    try:
        with pytest.raises(UpstreamFailure) as caught:
            if request.stream:
                async for _ in engine.stream(request):
                    pass
            else:
                await engine.complete(request)
        return caught.value
    finally:
        await engine.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_upstream_is_named_without_its_password_or_key(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = UpstreamEngine(url_with_secrets(f"127.0.0.1:{free_port()}"))
    error = asyncio.run(failure(engine, ask("m", stream)))
    shown = json.dumps(error.to_json())
    assert error.status == 502 and "cannot reach the upstream engine" in shown
    assert SECRET not in shown and SECRET not in str(error)
    assert "http://***@127.0.0.1" in shown and "api_key=***" in shown
    assert "api-version=2024-06-01" in shown  # what is no secret stays readable
    assert SECRET not in caplog.text


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_is_relayed_and_logged_without_the_secrets(
    stream: bool, peer: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host = peer.url.removeprefix("http://")
    engine = UpstreamEngine(url_with_secrets(host))
    error = asyncio.run(failure(engine, ask("fail-500", stream)))
    assert error.status == 500 and "peer failure 500" in error.message  # the route was reached
    assert SECRET not in json.dumps(error.to_json())
    assert "HTTP Request: POST" in caplog.text or not stream  # httpx logged the stream's call
    assert SECRET not in caplog.text


def test_the_upstream_still_gets_the_password_and_the_query(
    peer: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    engine = UpstreamEngine(url_with_secrets(peer.url.removeprefix("http://")))

    async def scenario() -> list[str]:
        await engine.start()
        try:
            whole = await engine.complete(ask("peer"))
            streamed = [item async for item in engine.stream(ask("peer", stream=True))]
            return [
                whole.response["choices"][0]["message"]["content"],
                streamed[-1].response["choices"][0]["message"]["content"],
            ]
        finally:
            await engine.close()

    assert [text.strip() for text in asyncio.run(scenario())] == ["echo: hi", "echo: hi"]
    sent = httpx.get(peer.url + "/peer/last").json()["authorization"]
    assert sent == "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert SECRET not in caplog.text
    assert SECRET not in engine.shown_url and SECRET not in engine.base_url.split("?")[0]


def test_query_parameters_named_like_secrets_are_masked() -> None:
    assert (
        without_password("https://h/v1?api_key=k1&access_token=k2&X-Amz-Signature=k3&sig=k4&n=1")
        == "https://h/v1?api_key=***&access_token=***&X-Amz-Signature=***&sig=***&n=1"
    )
    assert without_password("postgresql://reef:pw@db/reef?password=pw&sslmode=require") == (
        "postgresql://reef:***@db/reef?password=***&sslmode=require"
    )
