"""The upstream engine in front of a small OpenAI-compatible server started on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import TOKEN

UPSTREAM_KEY = "sk-upstream-secret-77"
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def reef(peer: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("reef-upstream")
    env = {"REEF_TOKEN": TOKEN, "REEF_UPSTREAM_API_KEY": UPSTREAM_KEY}
    server = reef_serve(
        folder, free_port(), "--engine", "upstream", "--upstream-url", f"{peer.url}/v1", env=env
    )
    with server.start():
        yield server


@pytest.fixture
def client(reef: ServerProcess) -> OpenAI:
    return OpenAI(base_url=reef.url + "/v1", api_key=TOKEN, max_retries=0)


def last_seen(peer: ServerProcess) -> dict:
    return httpx.get(peer.url + "/peer/last").json()


def record(reef: ServerProcess, receipt: str) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.get(f"{reef.url}/reef/records/{receipt}", headers=headers).json()


def test_whole_response_is_forwarded_and_recorded(
    client: OpenAI, reef: ServerProcess, peer: ServerProcess
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="peer", messages=HI, user="u-1", extra_body={"parallel_tool_calls": False}
    )
    assert raw.parse().choices[0].message.content == "echo: hello there"
    seen = last_seen(peer)
    assert seen["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert seen["body"]["user"] == "u-1" and seen["body"]["parallel_tool_calls"] is False
    stored = record(reef, raw.headers["x-reef-agent-record-id"])
    assert stored["engine"] == "upstream"
    assert stored["response"]["choices"][0]["message"]["content"] == "echo: hello there"
    assert stored["completion_token_ids"] is None
    assert stored["ttft_ms"] is None and stored["latency_ms"] > 0


def test_stream_is_forwarded_and_assembled(client: OpenAI, reef: ServerProcess) -> None:
    chunks = list(client.chat.completions.create(model="peer", messages=HI, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "echo: hello there"
    receipt = chunks[-1].model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    assert record(reef, receipt)["response"]["choices"][0]["message"]["content"] == text


def test_usage_chunk_passes_through_when_asked(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="peer", messages=HI, stream=True, stream_options={"include_usage": True}
        )
    )
    assert any(c.usage is not None and c.usage.total_tokens > 0 for c in chunks)


def test_tool_calls_pass_through_untouched(client: OpenAI, reef: ServerProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tool-call",
        messages=HI,
        tools=[TOOL],  # type: ignore[list-item]
    )
    call = raw.parse().choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "lookup",
        '{"x": 1}',
    )

    chunks = list(
        client.chat.completions.create(
            model="tool-call",
            messages=HI,
            tools=[TOOL],
            stream=True,  # type: ignore[list-item]
        )
    )
    receipt = chunks[-1].model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    message = record(reef, receipt)["response"]["choices"][0]["message"]
    assert message["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"x": 1}'},
        }
    ]
    assert record(reef, receipt)["response"]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("status", [400, 429, 500])
def test_upstream_errors_keep_their_status(client: OpenAI, status: int) -> None:
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as error:
            response = client.chat.completions.create(
                model=f"fail-{status}", messages=HI, stream=stream
            )
            if stream:
                list(response)  # type: ignore[arg-type]
        assert error.value.status_code == status
        assert f"peer failure {status}" in error.value.message


def test_the_upstream_key_is_never_stored_or_logged(client: OpenAI, reef: ServerProcess) -> None:
    client.chat.completions.create(model="peer", messages=HI)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    records = httpx.get(f"{reef.url}/reef/records", params={"limit": 1000}, headers=headers).text
    assert UPSTREAM_KEY not in records
    assert UPSTREAM_KEY not in reef.log()
    assert (Path(reef.cwd) / ".reef/experience.db").read_bytes().find(UPSTREAM_KEY.encode()) == -1


def test_configured_upstream_model_replaces_the_clients(
    peer: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n    model: pinned\n"
    )
    with reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        client = OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
        client.chat.completions.create(model="whatever", messages=HI)  # type: ignore[arg-type]
        assert last_seen(peer)["body"]["model"] == "pinned"
        assert [m.id for m in client.models.list()] == ["pinned"]


def test_unreachable_upstream_is_502_with_a_hint(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    server = reef_serve(
        tmp_path,
        free_port(),
        "--engine",
        "upstream",
        "--upstream-url",
        closed,
        env={"REEF_TOKEN": TOKEN},
    )
    with server.start():
        client = OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as error:
                client.chat.completions.create(model="m", messages=HI, stream=stream)  # type: ignore[arg-type]
            assert error.value.status_code == 502
            assert "cannot reach the upstream engine" in error.value.message
        status = httpx.get(
            server.url + "/reef/status", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status.json()["store"]["scenarios"] == {}


def test_access_lines_are_off_by_default_and_on_when_asked(
    client: OpenAI, reef: ServerProcess, peer: ServerProcess, tmp_path: Path
) -> None:
    client.chat.completions.create(model="peer", messages=HI)  # type: ignore[arg-type]
    assert "POST /v1/chat/completions HTTP/1.1" not in reef.log()  # the record is the trace
    (tmp_path / "reef.yaml").write_text(
        f"server:\n  access_log: true\nengine:\n  kind: upstream\n  upstream:\n"
        f"    url: {peer.url}/v1\n"
    )
    with reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        logged = OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
        logged.chat.completions.create(model="peer", messages=HI)  # type: ignore[arg-type]
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in server.log()
