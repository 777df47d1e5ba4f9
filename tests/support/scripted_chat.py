"""A scripted model behind an OpenAI-compatible upstream: its chat answers as JSON responses
(`answer`, `tool_call`), and `reef serve` in front of it (`scripted_reef`), so that what an
agent does with the answers is certain."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream


def answer(message: dict[str, Any]) -> Response:
    """A whole chat completion whose one choice is `message`."""
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    if message.get("tool_calls"):
        choice["finish_reason"] = "tool_calls"
    usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    body = {"id": "chatcmpl-script", "object": "chat.completion", "created": int(time.time())}
    return JSONResponse({**body, "model": "scripted", "choices": [choice], "usage": usage})


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message calling tool `name` with `arguments`."""
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": name, "arguments": json.dumps(arguments)}  # type: ignore[assignment]
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@contextmanager
def scripted_reef(
    project: Path,
    script: Callable[[Request], Awaitable[Response]],
    env: dict[str, str],
    upstream_key: str | None = None,
) -> Iterator[ServerProcess]:
    """`reef serve` in `project`, in front of a scripted model whose chat answers `script`
    gives (so an episode's outcome is certain)."""
    with chat_upstream(script, "scripted") as upstream:
        key = f"    api_key: {upstream_key}\n" if upstream_key else ""
        (project / "reef.yaml").write_text(
            f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n{key}"
        )
        with reef_serve(project, free_port(), env=env).start() as server:
            yield server
