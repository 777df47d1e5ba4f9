"""An ASGI app served by uvicorn on loopback from a thread of this process: a test's upstream
whose handlers can record what they were sent (`served_in_thread`), or an OpenAI-compatible one
from a chat-completions handler (`chat_upstream`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.testing.processes import free_port


@contextmanager
def served_in_thread(app: Any, what: str = "the app", timeout: float = 30) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL, http://127.0.0.1:PORT."""
    server = uvicorn.Server(uvicorn.Config(app, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, f"{what} did not start in {timeout:.0f} s"
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def chat_upstream(
    completions: Callable[[Request], Awaitable[Response]], model: str, what: str = "the upstream"
) -> Iterator[str]:
    """An OpenAI-compatible upstream whose `/v1/chat/completions` is `completions` and whose
    `/v1/models` lists `model`; yields its base URL, ending in /v1."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )
    with served_in_thread(app, what) as url:
        yield f"{url}/v1"
