"""Traces with OpenTelemetry: Reef's app served in a thread in front of a scripted upstream,
with the SDK's in-memory exporter (a span per request, its engine and store spans, a caller's
traceparent continued, no prompt text unless content capture is on), and `reef serve` exporting
to a real OTLP/HTTP receiver on loopback (the collector protocol, decoded with its protobuf)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reef.config import OtelConfig, load_config
from reef.engines import build_engine
from reef.releases.workflow import ReleaseWorkflow
from reef.server.state import ServerState
from reef.server.teacher import teachers_of
from reef.store import ExperienceStore
from reef.testing.in_process import reef_in_process
from reef.testing.processes import free_port, reef_serve
from reef.testing.threaded import served_in_thread
from reef.tracing import TRACE_TAG, Tracing, caller_trace_id, start_tracing
from tests.conftest import SMALL_ENGINE, TOKEN
from tests.support.in_process import serving
from tests.support.scripted_chat import answer

SECRET_PROMPT = "the-prompt-text-7f3a"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


async def hello(request: Request) -> Response:
    if not (await request.json()).get("stream"):
        return answer({"role": "assistant", "content": "Hello there."})
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello there."}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}},
    ]  # fmt: skip
    events = [f"data: {json.dumps({'id': 'c', 'model': 'scripted', **c})}\n\n" for c in chunks]
    return Response("".join(events) + "data: [DONE]\n\n", media_type="text/event-stream")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/chat/completions", hello, methods=["POST"])])
    with served_in_thread(app, "the upstream") as url:
        yield f"{url}/v1"


def traced_state(
    folder: Path, upstream: str, capture: bool
) -> tuple[ServerState, ExperienceStore, InMemorySpanExporter]:
    (folder / "reef.yaml").write_text(
        f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
    )
    config = load_config(folder / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    engine = build_engine(config.engine)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = ServerState(config, engine, store, ReleaseWorkflow(config, store))
    state.tracing = Tracing(provider, capture_content=capture)
    return state, store, exporter


def chat(url: str, headers: dict[str, str] | None = None, stream: bool = False) -> httpx.Response:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": SECRET_PROMPT}],
        "stream": stream,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def test_each_request_is_one_trace_with_its_engine_and_store_spans(
    tmp_path: Path, upstream: str
) -> None:
    state, store, exporter = traced_state(tmp_path, upstream, capture=False)
    with serving(state) as url:
        first, second = chat(url), chat(url, stream=True)
        assert first.status_code == second.status_code == 200
    spans = exporter.get_finished_spans()
    traces = {span.context.trace_id for span in spans}
    assert len(traces) == 2
    whole = ["POST /v1/chat/completions", "chat scripted", "reef.store.write"]
    for trace_id in traces:
        names = sorted(span.name for span in spans if span.context.trace_id == trace_id)
        # A stream's first token is seen: its prompt and decode phases are spans too.
        assert names in (whole, sorted([*whole, "reef.prompt", "reef.decode"]))
    engine = next(span for span in spans if span.name == "chat scripted")
    root = next(
        s
        for s in spans
        if s.name.startswith("POST") and s.context.trace_id == engine.context.trace_id
    )
    assert engine.parent is not None and engine.parent.span_id == root.context.span_id
    assert engine.attributes["gen_ai.operation.name"] == "chat"
    assert engine.attributes["gen_ai.request.model"] == "m"
    assert engine.attributes["gen_ai.usage.input_tokens"] == 5
    assert engine.attributes["gen_ai.usage.output_tokens"] == 5
    assert root.attributes["http.response.status_code"] == 200
    exported = json.dumps([dict(span.attributes or {}) for span in spans])
    assert SECRET_PROMPT not in exported and "Hello there" not in exported
    record = store.get_record(first.headers["x-reef-agent-record-id"])
    assert record is not None and record["metadata"]["tags"][TRACE_TAG] == format(
        root.context.trace_id, "032x"
    )
    store.close()


def spans_under(spans: list[Any], parent: Any) -> dict[str, Any]:
    return {
        span.name: span
        for span in spans
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    }


@pytest.mark.e2e
def test_the_engine_s_queue_prompt_and_decode_are_spans_under_its_answer(
    tmp_path: Path,
) -> None:
    """On the real llama.cpp engine (which queues requests itself and sees its first token)."""
    (tmp_path / "reef.yaml").write_text(SMALL_ENGINE)
    config = load_config(tmp_path / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = ServerState(config, build_engine(config.engine), store, ReleaseWorkflow(config, store))
    state.tracing = Tracing(provider)
    with serving(state) as url:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    spans = exporter.get_finished_spans()
    answer = next(span for span in spans if span.name.startswith("chat "))
    phases = spans_under(spans, answer)
    assert sorted(phases) == ["reef.decode", "reef.prompt", "reef.queue"]
    queue, prompt, decode = phases["reef.queue"], phases["reef.prompt"], phases["reef.decode"]
    assert answer.start_time == queue.start_time <= queue.end_time == prompt.start_time
    assert prompt.start_time <= prompt.end_time == decode.start_time
    assert decode.start_time <= decode.end_time == answer.end_time
    store.close()


def test_a_teacher_s_answer_is_a_span_under_the_call_s_answer(
    tmp_path: Path, upstream: str
) -> None:
    state, store, exporter = traced_state(tmp_path, upstream, capture=False)
    state.config = load_config_text(
        tmp_path,
        f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
        f"teacher:\n  url: {upstream}\n  model: big\n  share: 100\n",
    )
    state.teachers = teachers_of(state.config, ["default"])
    with serving(state) as url:
        assert chat(url).status_code == 200
    spans = exporter.get_finished_spans()
    answer = next(span for span in spans if span.name.startswith("chat "))
    teacher = spans_under(spans, answer)["reef.teacher"]
    assert teacher.attributes["reef.teacher.reason"] == "share"  # it took the session outright
    assert teacher.attributes["gen_ai.request.model"] == "m"
    assert answer.start_time <= teacher.start_time <= teacher.end_time == answer.end_time
    store.close()


def load_config_text(folder: Path, text: str) -> Any:
    (folder / "reef.yaml").write_text(text)
    return load_config(folder / "reef.yaml", env={})


def test_a_caller_s_traceparent_is_continued_and_content_is_captured_when_asked(
    tmp_path: Path, upstream: str
) -> None:
    state, store, exporter = traced_state(tmp_path, upstream, capture=True)
    with serving(state) as url:
        assert chat(url, {"traceparent": TRACEPARENT}).status_code == 200
    spans = exporter.get_finished_spans()
    assert {format(span.context.trace_id, "032x") for span in spans} == {CALLER_TRACE}
    root = next(span for span in spans if span.name.startswith("POST"))
    assert root.parent is not None and format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    engine = next(span for span in spans if span.name == "chat scripted")
    assert SECRET_PROMPT in engine.attributes["gen_ai.input.messages"]
    assert "Hello there." in engine.attributes["gen_ai.output.messages"]
    store.close()


def test_tracing_is_off_unless_configured_and_a_configured_one_without_the_extra_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert start_tracing(OtelConfig(), {}) is None
    assert (
        start_tracing(OtelConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
        is None
    )
    import builtins

    real_import = builtins.__import__

    def without_sdk(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry.sdk") or name.startswith("opentelemetry.exporter"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_sdk)
    with pytest.raises(Exception, match=r"pip install 'reef\[otel\]'"):
        start_tracing(OtelConfig(enabled=True), {})
    assert start_tracing(OtelConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) is None


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.arrived = threading.Event()

    async def traces(self, request: Request) -> Response:
        exported = ExportTraceServiceRequest.FromString(await request.body())
        self.headers.append(dict(request.headers))
        for resource in exported.resource_spans:
            for scope in resource.scope_spans:
                self.spans += [(resource, span) for span in scope.spans]
        self.arrived.set()
        return Response(b"", media_type="application/x-protobuf")


def test_reef_serve_exports_its_spans_to_an_otlp_http_collector(
    tmp_path: Path, upstream: str
) -> None:
    collector = Collector()
    app = Starlette(routes=[Route("/v1/traces", collector.traces, methods=["POST"])])
    (tmp_path / "reef.yaml").write_text(
        f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
        "otel:\n  service_name: reef-under-test\n"
    )
    with served_in_thread(app, "the collector") as collector_url:
        env = {
            "REEF_TOKEN": TOKEN,
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector_url,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-key=k-123",
        }
        with reef_serve(tmp_path, free_port(), env=env).start() as server:
            assert chat(server.url, {"authorization": f"Bearer {TOKEN}"}).status_code == 200
            deadline = time.monotonic() + 20
            while len(collector.spans) < 3 and time.monotonic() < deadline:
                collector.arrived.wait(0.5)
    names = sorted(span.name for _, span in collector.spans)
    assert names[:3] == ["POST /v1/chat/completions", "chat scripted", "reef.store.write"]
    resource = collector.spans[0][0].resource
    service = [a.value.string_value for a in resource.attributes if a.key == "service.name"]
    assert service == ["reef-under-test"]
    assert collector.headers[0]["x-collector-key"] == "k-123"


def test_with_tracing_off_the_record_still_keeps_the_caller_s_trace_id(tmp_path: Path) -> None:
    """A record is found from a trace whatever the exporter: the caller's `traceparent` trace id
    is kept in the record's tags with otel off; a malformed header keeps nothing."""
    with reef_in_process(tmp_path) as server:
        assert server.state.tracing is None
        kept = chat(server.url, {"traceparent": TRACEPARENT})
        malformed = chat(server.url, {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"})
        records = {
            response.headers["x-reef-agent-record-id"]: server.state.store.get_record(
                response.headers["x-reef-agent-record-id"]
            )
            for response in (kept, malformed)
        }
    tags = [(record["metadata"] or {}).get("tags") or {} for record in records.values()]
    assert tags[0].get(TRACE_TAG) == CALLER_TRACE
    assert TRACE_TAG not in tags[1]
    assert caller_trace_id({"traceparent": f"ff-{CALLER_TRACE}-00f067aa0ba902b7-01"}) is None
    later = f"01-{CALLER_TRACE}-00f067aa0ba902b7-01-more"
    assert caller_trace_id({"traceparent": later}) == CALLER_TRACE
