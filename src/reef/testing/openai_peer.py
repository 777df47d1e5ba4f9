"""A minimal OpenAI-compatible server for tests and benchmarks of the upstream engine.

It answers `POST /v1/chat/completions` by echoing the last user message (`echo: <text>`), whole
or streamed, `GET /v1/models`, and, as vLLM does, `GET /health` and
`POST /v1/load_lora_adapter`. Special models drive edge cases:
`fail-<status>` answers with that HTTP status and an OpenAI error body; `tool-call` answers with a
call to the first tool in the request; `reply:<text>` answers with that text; `words` answers the
echo cut to `max_tokens` words, with finish_reason `length` when cut (a model whose tokens are
words). A last user message starting `sleep <seconds>:` is answered that much later (a slow
model: a gate that takes a while). `GET /peer/last`
returns the last request it saw, with its Authorization header, so tests can check what was
forwarded.

Run it alone with `python -m reef.testing.openai_peer --port 9000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reef.protocol import message_text

_last: dict[str, Any] = {}
_adapters: dict[str, str] = {}


def _echo(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            return f"echo: {message_text(message.get('content'))}"
    return "echo:"


def _delay(body: dict[str, Any]) -> float:
    """Seconds the last user message asks the answer to wait (`sleep <seconds>: ...`)."""
    said = re.match(r"echo: sleep ([0-9.]+):", _echo(body))
    return float(said.group(1)) if said else 0.0


def _tool_call(body: dict[str, Any]) -> dict[str, Any]:
    name = body["tools"][0]["function"]["name"]
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"x": 1}'}}


async def chat(request: Request) -> Response:
    body = await request.json()
    _last.clear()
    _last.update({"body": body, "authorization": request.headers.get("authorization")})
    model = str(body.get("model") or "peer")
    if model.startswith("fail-"):
        status = int(model.removeprefix("fail-"))
        error = {"message": f"peer failure {status}", "type": "peer_error", "code": None}
        return JSONResponse({"error": error}, status_code=status)
    await asyncio.sleep(_delay(body))
    text = model.removeprefix("reply:") if model.startswith("reply:") else _echo(body)
    finish = "stop"
    if model == "words" and body.get("max_tokens") and len(text.split()) > body["max_tokens"]:
        text, finish = " ".join(text.split()[: body["max_tokens"]]), "length"
    call = _tool_call(body) if model == "tool-call" and body.get("tools") else None
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": len(text.split()),
        "total_tokens": 3 + len(text.split()),
    }
    envelope = {"id": "chatcmpl-peer", "created": int(time.time()), "model": model}
    if body.get("stream"):
        return StreamingResponse(
            _chunks(envelope, text, call, usage, body, finish), media_type="text/event-stream"
        )
    message: dict[str, Any] = {"role": "assistant", "content": None if call else text}
    if call:
        message["tool_calls"] = [call]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if call else finish,
        "logprobs": None,
    }
    return JSONResponse(
        {**envelope, "object": "chat.completion", "choices": [choice], "usage": usage}
    )


async def _chunks(
    envelope: dict[str, Any],
    text: str,
    call: dict[str, Any] | None,
    usage: dict[str, Any],
    body: dict[str, Any],
    finish: str,
) -> AsyncIterator[bytes]:
    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            **envelope,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    yield event({"role": "assistant", "content": ""})
    if call:
        yield event(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        yield event(
            {"tool_calls": [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]}
        )
        yield event({}, "tool_calls")
    else:
        for word in text.split(" "):
            yield event({"content": word + " "})
        yield event({}, finish)
    if (body.get("stream_options") or {}).get("include_usage"):
        chunk = {**envelope, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def models(request: Request) -> Response:
    return JSONResponse(
        {"object": "list", "data": [{"id": "peer", "object": "model", "owned_by": "peer"}]}
    )


async def last(request: Request) -> Response:
    return JSONResponse(_last)


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def load_lora_adapter(request: Request) -> Response:
    """vLLM's dynamic LoRA route: remembers the adapter so later calls can name it."""
    body = await request.json()
    _adapters[body["lora_name"]] = body["lora_path"]
    return Response("Success", status_code=200)


async def adapters(request: Request) -> Response:
    return JSONResponse(_adapters)


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/peer/last", last, methods=["GET"]),
        Route("/health", health, methods=["GET"]),  # as vLLM's server has
        Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),  # as vLLM's has
        Route("/peer/adapters", adapters, methods=["GET"]),
    ]
)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
