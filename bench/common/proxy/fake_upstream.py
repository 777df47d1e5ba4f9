"""A fast stand-in for a remote model: an HTTP/1.1 server on raw asyncio (uvloop when installed)
that answers every POST with one fixed chat completion, over keep-alive connections.

It parses only what it must (the end of the headers and Content-Length), so its own cost per
request is a few tens of microseconds and the benchmark measures the proxies, not the upstream.
`GET /v1/models` answers the model list, so a proxy's readiness checks pass.

Run it alone with `python -m bench.common.proxy.fake_upstream --port 9100` from the repository root;
`bench/common/proxy/servers.py` starts it by its file path, from any folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-fake",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "fake-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Red, green and blue."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
}
MODELS: dict[str, Any] = {
    "object": "list",
    "data": [{"id": "fake-model", "object": "model", "owned_by": "bench"}],
}


def _answer(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


CHAT_ANSWER = _answer(COMPLETION)
MODELS_ANSWER = _answer(MODELS)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._answer_one():
            pass

    def _answer_one(self) -> bool:
        """Answer the first whole request in the buffer; False when none is whole yet."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = self._buffer[:end].lower()
        length = 0
        marker = head.find(b"content-length:")
        if marker >= 0:
            line_end = head.find(b"\r\n", marker)
            length = int(head[marker + 15 : line_end if line_end >= 0 else None])
        if len(self._buffer) < end + 4 + length:
            return False
        self._buffer = self._buffer[end + 4 + length :]
        self._transport.write(  # type: ignore[union-attr]
            CHAT_ANSWER if head.startswith(b"post") else MODELS_ANSWER
        )
        return True


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Connection, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    try:
        import uvloop

        uvloop.run(serve(port))
    except ImportError:
        asyncio.run(serve(port))


if __name__ == "__main__":
    main()
