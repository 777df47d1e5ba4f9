"""Checkpoint releases on vLLM: its documented weight reload, after the requests in flight.

Real vLLM did not run here (it needs a CUDA GPU). The stand-in serves vLLM's dev-mode routes as
vLLM documents them (`POST /collective_rpc` with `update_config` then `reload_weights`, and
`POST /reset_prefix_cache`, present only with VLLM_SERVER_DEV_MODE=1) and records, in order, each
call and each chat request with the weights it ran on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from reef.engines.vllm import VLLMEngine
from reef.errors import Unsupported
from reef.protocol import ChatRequest
from reef.testing.processes import free_port
from tests.engines.test_vllm import stand_in

RELOADS = """
import asyncio
import uvicorn
from starlette.responses import JSONResponse
from reef.testing.openai_peer import app as peer

dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
events = []
weights = [sys.argv[2]]  # vllm serve MODEL: the model it starts with

async def read_body(receive):
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body

def replay(body):
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    return receive

async def app(scope, receive, send):
    path = scope.get("path", "")
    if path == "/peer/events":
        return await JSONResponse(events)(scope, receive, send)
    if scope["type"] != "http":
        return await peer(scope, receive, send)
    body = await read_body(receive)
    if path in ("/collective_rpc", "/reset_prefix_cache"):
        if not dev_mode:
            return await JSONResponse({"detail": "Not Found"}, 404)(scope, receive, send)
        call = json.loads(body) if body else {}
        events.append([path, call.get("method"), call.get("args")])
        if call.get("method") == "update_config":
            weights[0] = call["args"][0]["model_config"]["model"]
        return await JSONResponse({"results": [None]})(scope, receive, send)
    if path == "/v1/chat/completions":
        events.append(["chat", weights[0]])
        if b"slow" in body:
            await asyncio.sleep(1.0)
        events.append(["done", weights[0]])
    await peer(scope, replay(body), send)

port = int(sys.argv[sys.argv.index("--port") + 1])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def checkpoint_folder(folder: Path) -> Path:
    weights = folder / "checkpoint"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"model_type": "llama"}')
    return weights


def ask(text: str) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": text}]})


def test_a_checkpoint_reloads_vllm_s_weights_once_the_requests_on_the_old_ones_finish(
    tmp_path: Path,
) -> None:
    script, _ = stand_in(tmp_path, RELOADS)
    port = free_port()
    engine = VLLMEngine(model="org/model", executable=str(script), port=port, has_cuda=lambda: True)
    weights = checkpoint_folder(tmp_path / "default@2")

    async def scenario() -> list:
        await engine.start()
        try:
            slow = asyncio.create_task(engine.complete(ask("slow on the base")))
            await asyncio.sleep(0.3)  # it runs on the base weights now
            answer = await engine.complete(ask("on the checkpoint"), checkpoint=weights)
            await slow
            await engine.complete(ask("again"), checkpoint=weights)  # loaded: no reload
            await engine.complete(ask("back on the base"))
            assert answer.response["choices"][0]["message"]["content"] == "echo: on the checkpoint"
            return httpx.get(f"http://127.0.0.1:{port}/peer/events").json()
        finally:
            await engine.close()

    events = asyncio.run(scenario())
    update = ["/collective_rpc", "update_config", [{"model_config": {"model": str(weights)}}]]
    back = ["/collective_rpc", "update_config", [{"model_config": {"model": "org/model"}}]]
    reload = ["/collective_rpc", "reload_weights", None]
    reset = ["/reset_prefix_cache", None, None]
    assert events == [
        ["chat", "org/model"],
        ["done", "org/model"],  # the request in flight finished on the old weights first
        update,
        reload,
        reset,
        ["chat", str(weights)],
        ["done", str(weights)],
        ["chat", str(weights)],
        ["done", str(weights)],
        back,
        reload,
        reset,
        ["chat", "org/model"],
        ["done", "org/model"],
    ]


def test_a_gguf_checkpoint_is_refused_on_vllm_naming_what_it_needs(tmp_path: Path) -> None:
    script, _ = stand_in(tmp_path, RELOADS)
    engine = VLLMEngine(model="m", executable=str(script), port=free_port(), has_cuda=lambda: True)
    (tmp_path / "default@1" / "checkpoint").mkdir(parents=True)
    (tmp_path / "default@1" / "checkpoint" / "model.gguf").write_bytes(b"GGUF")

    async def scenario() -> None:
        await engine.start()
        try:
            with pytest.raises(Unsupported, match="no Hugging Face model folder"):
                await engine.complete(ask("hi"), checkpoint=tmp_path / "default@1" / "checkpoint")
            await engine.complete(ask("hi"))  # and it still serves
        finally:
            await engine.close()

    asyncio.run(scenario())
