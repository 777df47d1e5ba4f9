"""Each HTTP request in its span, when tracing is on (`reef.tracing`)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.tracing import Tracing

# Polled by load balancers and scrapers, many times a minute: no span of their own.
UNTRACED_PATHS = frozenset({"/healthz", "/metrics"})


class TraceRequests:
    """ASGI middleware: each HTTP request in its span, with the status it answered."""

    def __init__(self, app: ASGIApp, tracing: Tracing | None) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.tracing is None or scope["path"] in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import Status, StatusCode

        with self.tracing.request_span(scope) as span:

            async def answering(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, answering)
