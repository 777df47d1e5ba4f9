"""Counts the HTTP requests the server is answering, so that a call can tell it is alone.

A call that is the only one in flight has nobody to share a commit with: its record is then
committed on the event loop's thread (see `reef.store.writer`), which saves the two thread
hand-offs that a group commit costs.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class InFlight:
    """How many HTTP requests are being answered now (from the first byte to the last sent)."""

    def __init__(self) -> None:
        self.count = 0

    @property
    def alone(self) -> bool:
        """Whether the request asking is the only one in flight."""
        return self.count <= 1


class CountInFlight:
    """ASGI middleware keeping an `InFlight` up to date."""

    def __init__(self, app: ASGIApp, in_flight: InFlight) -> None:
        self.app = app
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.count -= 1
