"""Forward chat requests to any OpenAI-compatible base URL (one that ends in `/v1`).

Requests are forwarded as the server hands them over (tools, tool calls and unknown fields
included, after the release's harness was applied), with `model` replaced when `upstream.model`
is set. A request nothing changed (no harness, no model to replace) goes upstream as the bytes
the client sent, and a whole answer comes back as the bytes the upstream sent, read once with
orjson for the record. Whole responses go through aiohttp, whose connection pool costs little per
request (httpx's scans every pooled connection with system calls on each request); streams go
through httpx and are parsed by httpx-sse. Upstream HTTP errors are relayed with their status; an
upstream that cannot be reached is a 502. The API key is sent upstream and never stored.

A user and password in the URL (`https://user:secret@host/v1`) are sent as Basic authentication
(when no API key is set) and taken out of the URL the HTTP clients see; query parameters
(`?api-version=`, `?api_key=`) stay on every route. Every URL a message or log line shows is
masked (`reef.urls.without_password`: `https://***@host/v1?api_key=***`), and so is any secret
of the URL that an HTTP library's own words or an upstream's error carry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_sse import EventSource, ServerSentEvent, SSEError

from reef.engines.base import Capabilities
from reef.errors import Unsupported, UpstreamFailure
from reef.protocol import ChatRequest, Completion, StreamItem, assemble_chunks
from reef.urls import masked, without_password


class _MaskedURLs(logging.Filter):
    """Masks the URLs in httpx's log lines (`HTTP Request: POST URL`, at info, which
    `reef serve --log-level debug` shows): a route's query may carry a key."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                without_password(str(arg)) if "://" in str(arg) else arg for arg in record.args
            )
        return True


_MASK = _MaskedURLs()


class UpstreamEngine:
    name = "upstream"
    capabilities = Capabilities(token_ids=False, logprobs=False)

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self._given_url = base_url  # never shown: it may carry a password or a key
        self.base_url, self._basic = _without_userinfo(base_url.rstrip("/"))
        self.shown_url = without_password(base_url.rstrip("/"))
        self._model = model
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None

    @property
    def model(self) -> str:
        return self._model or "upstream"

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        if not self._api_key and self._basic is not None:
            headers = {"Authorization": f"Basic {self._basic}"}
        if _MASK not in logging.getLogger("httpx").filters:
            logging.getLogger("httpx").addFilter(_MASK)
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self._timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self._session = aiohttp.ClientSession(
            headers={**headers, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=self._timeout_s, connect=10.0),
            connector=aiohttp.TCPConnector(limit=256),
        )
        self._proxy = environment_proxy(self.base_url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _payload(self, request: ChatRequest, stream: bool, model: str | None = None) -> bytes:
        """The JSON to send: the client's own bytes when nothing about the request changed."""
        model = model or self._model
        if request.raw_body is not None and request.stream == stream and not model:
            return request.raw_body
        body = request.model_dump(exclude_unset=True, exclude_none=False)
        body["stream"] = stream
        if model:
            body["model"] = model
        return dumps(body)

    async def _model_for(self, adapter: Path | None) -> str | None:
        """The model name to request; engines that serve adapters by name override this."""
        if adapter is not None:
            raise Unsupported(
                f"the {self.name} engine cannot serve LoRA releases; use llamacpp or vllm"
            )
        return None

    def _weights(self, checkpoint: Path | None) -> AbstractAsyncContextManager[None]:
        """Hold the weights a request runs on while it runs; engines that reload full weights
        (a checkpoint release) override this."""
        if checkpoint is not None:
            raise Unsupported(
                f"the {self.name} engine cannot serve checkpoint releases (its weights are "
                "remote); use llamacpp or vllm"
            )
        return contextlib.nullcontext()

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise UpstreamFailure("the upstream engine is not started", status=503)
        return self._client

    @property
    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise UpstreamFailure("the upstream engine is not started", status=503)
        return self._session

    async def complete(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> Completion:
        async with self._weights(checkpoint):
            model = await self._model_for(adapter)
            payload = self._payload(request, False, model)
            data, content = await self._post_json("/chat/completions", payload)
        # A whole response has no first token to time: the record's latency_ms says it all.
        return Completion(
            response=data, model=data.get("model") or self.model, raw_response=content
        )

    async def forward_json(
        self,
        path: str,
        body: dict[str, Any],
        adapter: Path | None = None,
        checkpoint: Path | None = None,
    ) -> dict[str, Any]:
        """POST `body` to another OpenAI route of the upstream (`/completions`, `/embeddings`)
        and return its JSON answer; `model` is replaced as for chat requests."""
        async with self._weights(checkpoint):
            model = await self._model_for(adapter) or self._model
            payload = dumps({**body, "model": model} if model else body)
            data, _ = await self._post_json(path, payload)
        return data

    async def _post_json(self, path: str, payload: bytes) -> tuple[dict[str, Any], bytes]:
        """POST to an upstream route; its JSON object and its bytes, or its error relayed with
        its status."""
        url = self.route(path)
        try:
            async with self._aiohttp.post(url, data=payload, proxy=self._proxy) as response:
                content = await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise self._unreachable(path, error) from None
        if response.status >= 400:
            raise self._relayed(response.status, content)
        shown = self.shown_route(path)
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise UpstreamFailure(f"upstream at {shown} answered with invalid JSON") from None
        if not isinstance(data, dict):
            raise UpstreamFailure(f"upstream at {shown} answered with JSON that is not an object")
        return data, content

    def route(self, path: str) -> str:
        """The URL of an upstream route: `path` after the base URL's path, before its query."""
        return _joined(self.base_url, path)

    def shown_route(self, path: str) -> str:
        """`route(path)` as messages show it: no password, no key."""
        return _joined(self.shown_url, path)

    def _unreachable(self, path: str, error: Exception) -> UpstreamFailure:
        reason = masked(f"{type(error).__name__}: {error}", self._given_url)
        return UpstreamFailure(
            f"cannot reach the upstream engine at {self.shown_route(path)} ({reason}); "
            "check engine.upstream.url (a base URL ending in /v1) and that the server is running"
        )

    def _relayed(self, status: int, content: bytes) -> UpstreamFailure:
        failure = _relayed(status, content)
        failure.message = masked(failure.message, self._given_url)
        failure.args = (failure.message,)
        return failure

    async def stream(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        async with self._weights(checkpoint):
            async for item in self._stream(request, adapter):
                yield item

    async def _stream(
        self, request: ChatRequest, adapter: Path | None
    ) -> AsyncIterator[StreamItem]:
        model = await self._model_for(adapter)
        url = self.route("/chat/completions")
        started = time.perf_counter()
        chunks: list[dict[str, Any]] = []
        ttft_ms = None
        try:
            async with self._http.stream(
                "POST",
                url,
                content=self._payload(request, True, model),
                headers={"Content-Type": "application/json"},
            ) as response:
                if response.status_code >= 400:
                    raise self._relayed(response.status_code, await response.aread())
                async for chunk in _sse_chunks(response):
                    if ttft_ms is None:
                        ttft_ms = (time.perf_counter() - started) * 1000
                    chunks.append(chunk)
                    yield chunk
        except (httpx.HTTPError, httpx.InvalidURL) as error:
            raise self._unreachable("/chat/completions", error) from None
        response_object = assemble_chunks(chunks)
        yield Completion(
            response=response_object,
            model=response_object.get("model") or self.model,
            ttft_ms=ttft_ms,
        )


async def _sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The chat chunks of an upstream's event stream, up to `data: [DONE]`.

    httpx-sse parses the stream by the SSE rules: a `data:` field split over several lines is
    joined with newlines, `event:` and `id:` lines name and number an event, `:` lines are
    comments, and a line may end in LF, CR LF or CR. Chunks come in unnamed (`message`)
    events; an `error` event, or a chunk holding an `error`, is the upstream failing mid-stream;
    events of any other name (keep-alives, a vendor's extras) are not chat chunks and are skipped.
    """
    try:
        async for event in EventSource(response).aiter_sse():
            if event.event not in ("message", "error") or not event.data:
                continue
            if event.data.strip() == "[DONE]":
                return
            yield _chunk_of(event)
    except SSEError as error:  # the body is not an event stream at all
        raise UpstreamFailure(f"upstream answered a stream request without SSE: {error}") from None


def _chunk_of(event: ServerSentEvent) -> dict[str, Any]:
    try:
        chunk = json.loads(event.data)
    except ValueError:
        if event.event == "error":
            raise UpstreamFailure(f"upstream failed mid-stream: {event.data[:500]}") from None
        raise UpstreamFailure(
            f"upstream sent a stream event that is not JSON: {event.data[:200]}"
        ) from None
    if event.event == "error" or (isinstance(chunk, dict) and "error" in chunk):
        raise UpstreamFailure(f"upstream failed mid-stream: {_message_of(chunk)}")
    if not isinstance(chunk, dict):
        raise UpstreamFailure(
            f"upstream sent a stream event that is not an object: {event.data[:200]}"
        )
    return chunk


def _message_of(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("detail"):
            return str(body["detail"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return json.dumps(body)[:500]


def _relayed(status: int, content: bytes) -> UpstreamFailure:
    try:
        detail = _message_of(json.loads(content))
    except ValueError:
        detail = content.decode("utf-8", errors="replace")[:500]
    return UpstreamFailure(f"upstream returned HTTP {status}: {detail}", status=status)


def environment_proxy(url: str) -> str | None:
    """The proxy that HTTP_PROXY, HTTPS_PROXY and NO_PROXY name for `url`, as httpx reads them.
    Read once: aiohttp's own `trust_env` also looks up ~/.netrc on a thread for every request."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def dumps(body: dict[str, Any]) -> bytes:
    """JSON bytes by orjson; by the standard library where orjson refuses (integers past 64
    bits, keys that are not strings)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, ensure_ascii=False).encode()


def _joined(base_url: str, path: str) -> str:
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def _without_userinfo(url: str) -> tuple[str, str | None]:
    """`url` without `user:password@`, and them as Basic credentials (base64), if it had them."""
    try:
        parts = urllib.parse.urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return url, None
    if "@" not in parts.netloc:
        return url, None
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    pair = f"{urllib.parse.unquote(user or '')}:{urllib.parse.unquote(password or '')}"
    return bare, base64.b64encode(pair.encode()).decode()
