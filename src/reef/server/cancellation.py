"""Stop work for clients that have gone away.

A whole (non-streamed) response is computed by a handler that Starlette does not cancel when
the client hangs up, so abandoned requests would keep the engine busy to the end while retries
pile up behind them. `until_disconnected` runs the engine call beside a listener for the ASGI
`http.disconnect` message and cancels the call when it arrives: the engine drops a queued
request without running it, and stops a running one at its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """The result of `work`, unless the client disconnects first: then `work` is cancelled."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping this handler: stop the work too
        task.cancel()
        raise
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientDisconnected("the client disconnected before the answer was ready")
    return task.result()
