"""Stop work for clients that have gone away.

A whole (non-streamed) response is computed by a handler that Starlette does not cancel when
the client hangs up, so abandoned requests would keep the engine busy to the end while retries
pile up behind them. `until_disconnected` runs the engine call beside a listener for the ASGI
`http.disconnect` message and cancels the call when it arrives: the engine drops a queued
request without running it, and stops a running one at its next token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from reef.errors import ReefError

T = TypeVar("T")


class ClientDisconnected(ReefError):
    """The client hung up before its answer was ready; nothing was stored."""

    status = 499
    type = "client_closed_request"
    code = "client_disconnected"


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client disconnects (call it only after the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """The result of `work`, unless the client disconnects first: then `work` is cancelled.

    `work` runs in this task; only the listener gets a task of its own, which cancels this one
    when the client goes (one task a request instead of two and an `asyncio.wait`)."""
    handler = asyncio.current_task()
    assert handler is not None, "until_disconnected runs inside a request's task"
    listener = asyncio.ensure_future(wait_for_disconnect(request))
    state = {"returned": False, "disconnected": False}

    def on_disconnect(finished: asyncio.Future[None]) -> None:
        if finished.cancelled():
            return
        finished.exception()  # a failed read counts as a disconnect, its error retrieved
        if not state["returned"]:  # a callback already scheduled must not cancel what follows
            state["disconnected"] = True
            handler.cancel("client disconnected")

    listener.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        # Ours only if we asked and nobody else did (the server stopping this handler).
        if state["disconnected"] and handler.uncancel() == 0:
            raise ClientDisconnected(
                "the client disconnected before the answer was ready"
            ) from None
        raise
    finally:
        state["returned"] = True
        listener.cancel()
