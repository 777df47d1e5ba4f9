"""`until_disconnected`: the work's result, unless the client goes first or the server stops."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from reef.server.cancellation import ClientDisconnected, until_disconnected


def request_that_disconnects_after(seconds: float | None) -> Request:
    """A Starlette request whose client hangs up after `seconds` (None: never)."""

    async def receive() -> dict:
        if seconds is None:
            await asyncio.Event().wait()
        await asyncio.sleep(seconds or 0)
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def slow(seconds: float, ran: list[str]) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        ran.append("cancelled")
        raise
    ran.append("finished")
    return "answer"


def test_the_work_s_result_and_a_client_that_leaves_later_cancels_nothing() -> None:
    ran: list[str] = []

    async def scenario() -> str:
        answer = await until_disconnected(request_that_disconnects_after(0.02), slow(0.01, ran))
        await asyncio.sleep(0.05)  # the client leaves now: what the handler does next goes on
        return answer

    assert asyncio.run(scenario()) == "answer"
    assert ran == ["finished"]


def test_a_client_that_goes_cancels_the_work() -> None:
    ran: list[str] = []
    request = request_that_disconnects_after(0.01)
    with pytest.raises(ClientDisconnected):
        asyncio.run(until_disconnected(request, slow(5, ran)))
    assert ran == ["cancelled"]


def test_a_server_that_stops_the_handler_stops_the_work() -> None:
    ran: list[str] = []

    async def scenario() -> None:
        handler = asyncio.ensure_future(
            until_disconnected(request_that_disconnects_after(None), slow(5, ran))
        )
        await asyncio.sleep(0.01)
        handler.cancel()
        await handler

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert ran == ["cancelled"]


def test_a_server_stop_at_the_moment_the_client_leaves_is_not_swallowed() -> None:
    """The server cancels the handler in the very step the client's disconnect arrives: the
    handler must stop as cancelled, not turn the server's cancellation into a disconnect."""
    ran: list[str] = []
    handlers: list[asyncio.Task] = []

    async def receive() -> dict:
        await asyncio.sleep(0.01)
        handlers[0].cancel()  # the server stops the handler as the client goes
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)

    async def scenario() -> None:
        handler = asyncio.ensure_future(until_disconnected(request, slow(5, ran)))
        handlers.append(handler)
        await handler

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())
    assert ran == ["cancelled"]
