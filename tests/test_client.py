"""`reef.client` against a real `reef serve`: the token, the server's refusals, no server at all."""

from __future__ import annotations

import asyncio

import pytest

from reef.client import AsyncReefClient, ReefClient, ReefClientError
from reef.testing.processes import ServerProcess, free_port
from tests.conftest import ROTATED_TOKEN, TOKEN


def test_a_call_with_the_token_answers_the_json(llama_server: ServerProcess) -> None:
    with ReefClient(llama_server.url, TOKEN) as reef:
        assert reef.status()["engine"]["name"] == "llamacpp"
        page = reef.records("client-nothing-here", limit=1)
    assert page["data"] == [] and page["has_more"] is False


def test_the_token_is_the_first_of_reef_token(
    llama_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REEF_TOKEN", f" {ROTATED_TOKEN} ,not-a-token")
    with ReefClient(llama_server.url) as reef:
        assert reef.token == ROTATED_TOKEN
        assert "engine" in reef.status()
    monkeypatch.setenv("REEF_TOKEN", "not-a-token")
    with ReefClient(llama_server.url) as reef, pytest.raises(ReefClientError) as refused:
        reef.status()
    assert refused.value.status == 401 and "REEF_TOKEN" in refused.value.message


def test_a_refusal_carries_the_status_and_the_servers_message(
    llama_server: ServerProcess,
) -> None:
    with ReefClient(llama_server.url, TOKEN) as reef:
        with pytest.raises(ReefClientError) as missing:
            reef.get("/reef/records/rec_unknown")
        with pytest.raises(ReefClientError) as unknown:
            reef.report(["rec_unknown"], score=1, scenario="client")
    for error in (missing.value, unknown.value):
        assert error.status == 404 and "rec_unknown" in error.message
        assert str(error) == f"HTTP 404: {error.message}"
        assert not error.unreachable


def test_no_server_is_a_sentence_naming_the_url_without_its_password() -> None:
    port = free_port()
    with (
        ReefClient(f"http://reef:s3cret-pw@127.0.0.1:{port}/", TOKEN) as reef,
        pytest.raises(ReefClientError) as failed,
    ):
        reef.status()
    error = failed.value
    assert error.status is None and error.unreachable
    assert str(error) == (
        f"no Reef server answers at http://***@127.0.0.1:{port}: start one with `reef serve`"
    )
    assert "s3cret-pw" not in str(error) + error.url


def test_the_async_client_answers_and_refuses_alike(llama_server: ServerProcess) -> None:
    async def calls() -> tuple[dict, ReefClientError]:
        async with AsyncReefClient(llama_server.url, TOKEN) as reef:
            status = await reef.get("/reef/status")
            try:
                await reef.get("/reef/records/rec_unknown")
            except ReefClientError as error:
                return status, error
        raise AssertionError("an unknown record was found")

    status, error = asyncio.run(calls())
    assert status["engine"]["name"] == "llamacpp"
    assert error.status == 404 and "rec_unknown" in error.message
