"""How many HTTP requests the server is serving right now (a stream counts until it ends).

The store commits the record of the only request in flight on the event loop's own thread
(`ExperienceStore.add_record_async(alone=True)`): with nothing to group it with, the hand-offs to
the writer thread and back are pure latency.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from reef.server.state import ServerState


class CountInFlight:
    """ASGI middleware keeping `state.in_flight` up to date."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1
