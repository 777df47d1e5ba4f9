"""Traces with OpenTelemetry: the `otel` extra (`pip install 'reef[otel]'`), off unless
`otel.enabled: true` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

A span per HTTP request (kind SERVER, continuing a caller's W3C `traceparent`;
`reef.server.tracing` puts each request in it), and under an inference call's span the engine's
answer (`chat <model>`, with the GenAI semantic conventions' attributes:
`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens`, …) and the store's
write (`reef.store.write`). Under the answer, its phases where the engine measures them
(`reef.queue`: waiting for a slot; `reef.prompt`: reading the prompt to the first token;
`reef.decode`: the rest), and the teacher's answer when it took the call (`reef.teacher`). The
record keeps its trace id in the tag `otel_trace_id`; with tracing off, the caller's, read from
its `traceparent` header (`caller_trace_id`), so a record is found from a trace either way.
Prompts and answers are exported only with `otel.capture_content: true`.

The learning worker traces its work too: each learning step (`reef.learning.step`), the gate
that judges its candidate (`reef.gate`) and the publish that releases it (`reef.publish`), one
trace per step.

OpenTelemetry's packages are imported here only, and only once tracing is on: serving without
the extra never loads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.types import Scope

from reef.config import ConfigError, OtelConfig
from reef.protocol import ChatRequest, Completion

log = logging.getLogger("reef.tracing")
TRACE_TAG = "otel_trace_id"
# W3C Trace Context: version-trace_id-parent_id-flags, lowercase hex (version ff is invalid).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def caller_trace_id(headers: Mapping[str, str]) -> str | None:
    """The trace id of a call's W3C `traceparent` header, or None when it has none or a
    malformed one (all zeros, version ff, a later version's trailing fields are allowed)."""
    found = _TRACEPARENT.fullmatch(headers.get("traceparent", "").strip())
    if found is None:
        return None
    version, trace_id, parent_id, _, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"}:
        return None
    return None if set(parent_id) == {"0"} else trace_id
PROVIDER_NAME = {"llamacpp": "llama.cpp", "vllm": "vllm", "upstream": "openai"}


class Tracing:
    """A tracer over a tracer provider (the SDK's, with its exporter), and what it may export."""

    def __init__(self, provider: Any, capture_content: bool = False) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.provider = provider
        self.tracer = provider.get_tracer("reef")
        self.capture_content = capture_content

    @contextlib.contextmanager
    def request_span(self, scope: Scope) -> Iterator[Any]:
        """The span of one HTTP request, current while it runs, child of the caller's trace
        when the request carries a `traceparent`."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        carrier = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        with self.tracer.start_as_current_span(
            f"{scope['method']} {scope['path']}",
            context=extract(carrier),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as span:
            yield span

    def trace_id(self) -> str | None:
        """The current trace's id (32 hex digits), or None outside a span."""
        context = self._trace.get_current_span().get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None

    def engine_answered(
        self,
        engine: str,
        chat: ChatRequest,
        completion: Completion,
        started: float,
        teacher: tuple[str, float, Completion] | None = None,
    ) -> None:
        """The engine's answer as a child span of the current one, from `started` (a
        `time.perf_counter()` reading as the call began) to now, with its phases as children.
        `teacher`: the teacher took the call over (why, when it was asked, its answer)."""
        from opentelemetry.trace import SpanKind

        clock = _Clock()
        now_ns, begun_ns = clock.now_ns, clock.at(started)
        model = completion.model or chat.model or engine
        # Given at the start, the attributes are checked once, not under a lock one by one.
        attributes = self._genai_attributes(engine, chat, completion)
        span = self.tracer.start_span(
            f"chat {model}", kind=SpanKind.CLIENT, start_time=begun_ns, attributes=attributes
        )
        under = self._trace.set_span_in_context(span)
        if teacher is None:
            self._phases(under, completion, begun_ns, now_ns)
        else:
            self._teacher_answered(under, chat, teacher, clock)
        span.end(end_time=now_ns)

    def _phases(self, under: Any, completion: Completion, begun_ns: int, end_ns: int) -> None:
        """The engine's queue wait, prompt and decode, as the engine measured them."""
        prompt_from = begun_ns
        if completion.queue_ms is not None:
            prompt_from = begun_ns + int(completion.queue_ms * 1e6)
            self._interval(under, "reef.queue", begun_ns, prompt_from)
        if completion.ttft_ms is not None:
            first_token = max(prompt_from, begun_ns + int(completion.ttft_ms * 1e6))
            self._interval(under, "reef.prompt", prompt_from, first_token)
            self._interval(under, "reef.decode", first_token, end_ns)

    def _teacher_answered(
        self, under: Any, chat: ChatRequest, teacher: tuple[str, float, Completion], clock: _Clock
    ) -> None:
        reason, asked, answer = teacher
        attributes = {
            "reef.teacher.reason": reason,
            **self._genai_attributes("teacher", chat, answer),
        }
        span = self.tracer.start_span(
            "reef.teacher", context=under, start_time=clock.at(asked), attributes=attributes
        )
        span.end(end_time=clock.now_ns)

    def _interval(self, under: Any, name: str, start_ns: int, end_ns: int) -> None:
        self.tracer.start_span(name, context=under, start_time=start_ns).end(end_time=end_ns)

    def _genai_attributes(
        self, engine: str, chat: ChatRequest, completion: Completion
    ) -> dict[str, Any]:
        usage = completion.usage or {}
        choices = completion.response.get("choices") or [{}]
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME.get(engine, engine),
            "gen_ai.request.model": chat.model,
            "gen_ai.request.max_tokens": chat.max_tokens,
            "gen_ai.request.temperature": chat.temperature,
            "gen_ai.response.model": completion.model,
            "gen_ai.response.id": completion.response.get("id"),
            "gen_ai.response.finish_reasons": [str(c.get("finish_reason")) for c in choices],
            "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
            "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
            "reef.ttft_ms": completion.ttft_ms,
        }
        if self.capture_content:
            messages = [m.model_dump(exclude_none=True) for m in chat.messages]
            attributes["gen_ai.input.messages"] = json.dumps(messages)
            outputs = [c.get("message") for c in choices if c.get("message")]
            attributes["gen_ai.output.messages"] = json.dumps(outputs)
        return {name: value for name, value in attributes.items() if value is not None}

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span of the current one around a block (the store's write), current while
        it runs; attributes that are None are left out."""
        given = {key: value for key, value in attributes.items() if value is not None}
        with self.tracer.start_as_current_span(name, attributes=given) as span:
            yield span

    def shutdown(self) -> None:
        """Export what is still buffered, then stop."""
        self.provider.shutdown()


def start_tracing(config: OtelConfig, env: Mapping[str, str]) -> Tracing | None:
    """Tracing as `otel:` and the environment configure it, exporting OTLP over HTTP; None when
    it is off. `otel.enabled: true` without the extra is a configuration error; tracing asked
    for by the environment alone is a warning."""
    enabled = config.enabled if config.enabled is not None else bool(_endpoint(config, env))
    if not enabled:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        missing = "tracing needs OpenTelemetry's SDK: pip install 'reef[otel]'"
        if config.enabled:
            raise ConfigError(f"otel.enabled: {missing}") from None
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set, but %s; serving without traces", missing)
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
    endpoint = _endpoint(config, env) or "http://localhost:4318"
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
    log.info("tracing to %s/v1/traces", endpoint.rstrip("/"))
    return Tracing(provider, config.capture_content)


def traced(tracing: Tracing | None, name: str, **attributes: Any) -> Any:
    """`tracing.span(name, ...)`, or, with tracing off, a block that yields None: for code that
    runs traced or not (`set_on` then writes to the span only when there is one)."""
    if tracing is None:
        return contextlib.nullcontext()
    return tracing.span(name, **attributes)


def set_on(span: Any, **attributes: Any) -> None:
    """Set the attributes that are not None on `span`, if there is one."""
    if span is not None:
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)


class _Clock:
    """The wall clock (nanoseconds, as spans take it) at `time.perf_counter()` readings, all
    converted from one pair of readings, so that their order is kept."""

    def __init__(self) -> None:
        self.now_ns, self._now = time.time_ns(), time.perf_counter()

    def at(self, reading: float) -> int:
        return self.now_ns - int((self._now - reading) * 1e9)


def _endpoint(config: OtelConfig, env: Mapping[str, str]) -> str | None:
    return config.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
