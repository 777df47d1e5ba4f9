"""A real coding agent in an episode: pi (its npm binary, as `.ci/run` installs it), set up in
the sandbox by its adapter's install script, on a task of the shipped suite, through `reef
serve` in front of a scripted model that streams pi a `write` tool call (so the outcome is
certain whatever model would have been asked)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from reef.episodes.runner import EpisodeSettings, run_episode
from reef.episodes.sandbox import Limits
from reef.episodes.tasks import load_task
from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN
from tests.e2e.episodes.test_episodes import SUITE, answer
from tests.support.scripted_chat import scripted_reef


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-script",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


async def streamed(delta: dict[str, Any], finish: str) -> AsyncIterator[bytes]:
    yield chunk({"role": "assistant", **delta})
    yield chunk({}, finish)
    yield b"data: [DONE]\n\n"


async def writes_coral(request: Request) -> Response:
    """pi's `write` tool on /app/answer.txt, then a last answer once the tool has run."""
    body = await request.json()
    done = any(message["role"] == "tool" for message in body["messages"])
    if done:
        delta, finish = {"content": "Wrote coral to /app/answer.txt."}, "stop"
    else:
        arguments = json.dumps({"path": "/app/answer.txt", "content": "coral\n"})
        call = {"index": 0, "id": "call_1", "type": "function"}
        call["function"] = {"name": "write", "arguments": arguments}  # type: ignore[assignment]
        delta, finish = {"content": None, "tool_calls": [call]}, "tool_calls"
    if not body.get("stream"):
        return answer({"role": "assistant", **delta})
    return StreamingResponse(streamed(delta, finish), media_type="text/event-stream")


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if shutil.which("pi") is None:
        if os.environ.get("CI"):
            pytest.fail("pi is missing: .ci/run should have installed it")
        pytest.skip("pi is not installed (npm i -g @mariozechner/pi-coding-agent@0.73)")
    project = tmp_path_factory.mktemp("project")
    with scripted_reef(project, writes_coral, {"REEF_TOKEN": TOKEN}) as server:
        yield server


def test_pi_solves_a_task_in_the_sandbox_through_reef(reef: ServerProcess, tmp_path: Path) -> None:
    settings = EpisodeSettings(limits=Limits(wall_time_s=300), work_root=tmp_path)
    done = run_episode(
        load_task(SUITE / "write-word"), "pi", reef.url, token=TOKEN, settings=settings
    )
    assert done.passed, (done.error, done.agent_run, done.test_output)
    assert len(done.calls) >= 2  # the tool call, then the answer after the tool ran
    assert {call["session"] for call in done.calls} == {done.id}
    assert any(call["request"].get("tools") for call in done.calls)  # pi's own tools
    install_log = (done.workspace / "logs" / "agent" / "install.log").read_text()
    assert "pi harness" in install_log and "installed" in install_log
