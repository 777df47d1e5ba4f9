"""The serving core every API room answers through: a call served whole or streamed, stored as a
record before its receipt is handed out, and errors in the room's own shape.

Each call is served under the release its scenario serves when the call arrives (its binding:
a harness applied to the request, or a LoRA adapter), and is stamped and recorded with that
release's id even if the head moves while it runs. The record keeps the request as the client
sent it (its bytes, where the route has them); the release id says which harness was applied.
Every served call is stored as a record before its receipt is handed out: in the
`x-reef-agent-record-id` header for a whole response, and for a stream in a last chunk
`{"object": "chat.completion.chunk", "choices": [], "reef": {"agent_record_id": ...}}` sent just
before `data: [DONE]`. A failed call is never stored.

A whole answer the engine received as bytes (`Completion.raw_response`) is answered and stored
as those bytes. Records are built on the store's writer thread, off the event loop. A room whose
API has its own error shape (Anthropic's messages, the Responses API) wraps its endpoint in
`answering_errors_as`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from reef.errors import ReefError
from reef.protocol import ChatRequest, Completion, StreamItem
from reef.server.call import CallContext
from reef.server.cancellation import until_disconnected
from reef.server.http import sse
from reef.server.state import ServerState
from reef.server.teacher import Answer
from reef.store import Record
from reef.tracing import TRACE_TAG

log = logging.getLogger("reef.server")


def answered(completion: Completion, headers: dict[str, str]) -> Response:
    """A whole chat completion: the engine's own bytes where it has them, else its JSON."""
    if completion.raw_response is not None:
        return Response(completion.raw_response, media_type="application/json", headers=headers)
    return JSONResponse(completion.response, headers=headers)


async def served_whole(
    request: Request,
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    chat: ChatRequest,
    record_id: str | None = None,
    raw_body: bytes | None = None,
) -> tuple[Completion, dict[str, str]]:
    """A whole (not streamed) completion, stored before its receipt is handed out; the headers
    carry the release id and the receipt. Any API translated onto chat answers through this.
    `record_id` names the record in advance (an API whose answer's id names its record);
    `raw_body`, the bytes `body` was read from, is stored as they are."""
    started = time.perf_counter()
    metrics = state.metrics
    metrics.generating += 1
    try:
        answer = await _answered(request, state, call, chat)
    finally:
        metrics.generating -= 1
    metrics.served(answer.call.scenario, answer.completion, started)
    if state.tracing is not None:
        lesson = answer.lesson
        state.tracing.engine_answered(
            answer.call.answered_by or state.engine.name,
            chat,
            answer.completion,
            started,
            (lesson.reason, lesson.asked_at, lesson.completion) if lesson else None,
        )
    headers = await stored(
        state, answer.call, body, answer.completion, started, record_id, raw_body
    )
    if "x-reef-agent-record-id" in headers:
        await answer.demonstrate(state.store, headers["x-reef-agent-record-id"])
    return answer.completion, headers


async def _answered(
    request: Request, state: ServerState, call: CallContext, chat: ChatRequest
) -> Answer:
    """The engine's answer, unless the scenario's teacher takes the call over
    (`reef.server.teacher`)."""

    def student() -> Coroutine[Any, Any, Completion]:
        binding = call.binding
        return state.engine.complete(chat, adapter=binding.adapter, checkpoint=binding.checkpoint)

    teacher = state.teachers.get(call.scenario)
    if teacher is None:
        return Answer(await until_disconnected(request, student()), call)
    return await teacher.take_over(request, call, chat, student)


async def stored(
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    completion: Completion,
    started: float,
    record_id: str | None = None,
    raw_body: bytes | None = None,
) -> dict[str, str]:
    """Store a whole response's record (unless the caller opted out); the headers that answer
    it: the release id, and the receipt once the record is on disk."""
    headers = call.release_headers()
    if call.capture:
        build = _builder(state, call, body, completion, started, False, record_id, raw_body)
        receipt = await _write(state, build)
        headers["x-reef-agent-record-id"] = receipt
        state.metrics.scenario(call.scenario).records.inc()
        state.recorded(call.scenario, receipt)
    return headers


async def _write(state: ServerState, build: Callable[[], Record]) -> str:
    """Store a record through the writer's group commit (in its span, when tracing is on)."""
    if state.tracing is None:
        return await state.store.add_record_async(build, alone=state.in_flight.alone)
    with state.tracing.span("reef.store.write", **{"db.system.name": state.store.dialect}):
        return await state.store.add_record_async(build, alone=state.in_flight.alone)


def _builder(
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    completion: Completion,
    started: float,
    stream: bool,
    record_id: str | None,
    raw_body: bytes | None,
) -> functools.partial[Record]:
    """`record_of`, for the store's writer thread to call, with the latency taken now."""
    latency_ms = (time.perf_counter() - started) * 1000
    tracing = state.tracing
    trace_id = tracing.trace_id() if tracing is not None else call.caller_trace_id
    return functools.partial(
        record_of,
        state,
        call,
        body,
        completion,
        started,
        stream,
        record_id,
        latency_ms=latency_ms,
        raw_body=raw_body,
        trace_id=trace_id,
    )


# What a stream shape sends: an object, framed as `data: JSON`, or bytes already framed (an API
# with named events, such as Anthropic's `event: NAME\ndata: JSON`).
Frame = dict[str, Any] | bytes


class StreamShape(Protocol):
    """How an API other than chat completions shows a chat stream: each engine chunk as that
    API's chunk (None: nothing to send), the receipt chunk, and the response it stores.

    A shape may also define `end(completion) -> bytes`, sent in place of `data: [DONE]`, and
    `failed(error) -> bytes`, sent in place of the `data: {"error": ...}` event (`error` is that
    OpenAI-shaped object); without them the stream ends as chat completions' does."""

    def chunk(self, chunk: dict[str, Any]) -> Frame | None: ...

    def receipt(self, completion: Completion, record_id: str) -> Frame: ...

    def stored(self, completion: Completion) -> Completion: ...


class ChatShape:
    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        return chunk

    def receipt(self, completion: Completion, record_id: str) -> dict[str, Any]:
        return _receipt_chunk(completion, record_id)

    def stored(self, completion: Completion) -> Completion:
        return completion


def with_response(completion: Completion, response: dict[str, Any]) -> Completion:
    """`completion` answered in another API's shape (what that API's record stores)."""
    return dataclasses.replace(completion, response=response, raw_response=None)


async def streamed(
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    chat: ChatRequest,
    shape: StreamShape | None = None,
    record_id: str | None = None,
    raw_body: bytes | None = None,
) -> Response:
    """`raw_body`: the bytes `body` was read from, stored as they are."""
    shape = shape or ChatShape()
    started = time.perf_counter()
    metrics = state.metrics
    items = aiter(
        state.engine.stream(chat, adapter=call.binding.adapter, checkpoint=call.binding.checkpoint)
    )
    # Pull the first item before answering, so a request the engine refuses gets a real status.
    # Engines yield it as soon as the request is accepted, before it waits for its turn.
    metrics.generating += 1
    try:
        first = await anext(items)
    except BaseException:
        metrics.generating -= 1
        await _close(items)
        raise

    async def events() -> AsyncIterator[bytes]:
        item: StreamItem = first
        generating = True
        try:
            while not isinstance(item, Completion):
                shown = shape.chunk(item)
                if shown is not None:
                    yield _framed(shown)
                item = await anext(items)
            metrics.generating -= 1
            generating = False
            metrics.served(call.scenario, item, started)
            if state.tracing is not None:
                state.tracing.engine_answered(state.engine.name, chat, item, started)
            if call.capture:
                stored = shape.stored(item)
                build = _builder(state, call, body, stored, started, True, record_id, raw_body)
                receipt = await _write(state, build)
                metrics.scenario(call.scenario).records.inc()
                state.recorded(call.scenario, receipt)
                yield _framed(shape.receipt(stored, receipt))
            end = getattr(shape, "end", None)
            yield sse("[DONE]") if end is None else end(item)
        except ReefError as error:
            # Headers are gone: say it in the stream, as OpenAI does, and store nothing.
            log.warning("stream failed: %s", error.message)
            yield _failed(shape, error.to_json())
        except Exception as error:  # a store or engine failure: an error event, not a silent cut
            log.exception("stream failed")
            yield _failed(shape, _stream_failure(error))
        finally:
            if generating:
                metrics.generating -= 1
            await _close(items)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={**call.release_headers(), "cache-control": "no-cache"},
    )


def _framed(shown: Frame) -> bytes:
    return shown if isinstance(shown, bytes) else sse(shown)


def _failed(shape: StreamShape, error: dict[str, Any]) -> bytes:
    failed = getattr(shape, "failed", None)
    return sse(error) if failed is None else failed(error)


async def _close(items: AsyncIterator[StreamItem]) -> None:
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


def _stream_failure(error: Exception) -> dict[str, Any]:
    return {
        "error": {
            "message": f"the stream failed ({type(error).__name__}); nothing was stored; "
            "see the server log",
            "type": "server_error",
            "code": "stream_failed",
        }
    }


def _receipt_chunk(completion: Completion, record_id: str) -> dict[str, Any]:
    return {
        "id": completion.response.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.response.get("created"),
        "model": completion.response.get("model"),
        "choices": [],
        "reef": {"agent_record_id": record_id},
    }


def record_of(
    state: ServerState,
    call: CallContext,
    body: dict[str, Any],
    completion: Completion,
    started: float,
    stream: bool,
    record_id: str | None = None,
    latency_ms: float | None = None,
    raw_body: bytes | None = None,
    trace_id: str | None = None,
) -> Record:
    """The record of a served call. `latency_ms` defaults to the time since `started`;
    `raw_body` (the bytes `body` was read from) and the engine's `raw_response` are stored as
    they are, not serialised again; `trace_id`, the call's trace, is kept in a tag."""
    if latency_ms is None:
        latency_ms = (time.perf_counter() - started) * 1000
    raw_response = completion.raw_response
    record = Record(
        scenario=call.scenario,
        session=call.session,
        request=body,
        response=completion.response,
        engine=call.answered_by or state.engine.name,
        model=completion.model,
        release_id=call.release_id,
        stream=stream,
        completion_token_ids=completion.token_ids,
        completion_logprobs=completion.token_logprobs,
        prompt_token_ids=completion.prompt_token_ids,
        sampling=completion.sampling,
        usage=completion.usage,
        latency_ms=latency_ms,
        ttft_ms=completion.ttft_ms,
        routing_release_id=call.route[0] if call.route else None,
        arm=call.route[1] if call.route else None,
        failed_arm=call.failed_arm,
        tags={**call.tags, TRACE_TAG: trace_id} if trace_id else call.tags,
        request_json=None if raw_body is None else raw_body.decode(),
        response_json=None if raw_response is None else raw_response.decode(),
    )
    return dataclasses.replace(record, id=record_id) if record_id else record


Endpoint = Callable[[Request], Awaitable[Response]]


def answering_errors_as(
    body_of: Callable[[ReefError], dict[str, Any]],
) -> Callable[[Endpoint], Endpoint]:
    """An endpoint whose errors answer in its API's shape, `body_of(error)`, with the error's
    status and headers; an unexpected exception is logged and answers a 500 in that shape."""

    def wrap(endpoint: Endpoint) -> Endpoint:
        async def answering(request: Request) -> Response:
            where = f"{request.method} {request.url.path}"
            try:
                return await endpoint(request)
            except ReefError as error:
                if error.status >= 500:
                    log.warning("%s -> %s: %s", where, error.status, error.message)
                body = body_of(error)
                return JSONResponse(body, status_code=error.status, headers=error.headers)
            except Exception as error:
                log.exception("unexpected error on %s", where)
                failure = ReefError(
                    f"internal error ({type(error).__name__}); see the server log",
                    code="internal_error",
                )
                return JSONResponse(body_of(failure), status_code=500)

        return answering

    return wrap
