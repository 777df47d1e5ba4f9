"""The in-flight count that lets the only request commit its record on the event loop."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reef.server.in_flight import CountInFlight, InFlight


def test_the_count_follows_requests_in_and_out() -> None:
    in_flight = InFlight()
    seen: list[tuple[int, bool]] = []

    async def main() -> None:
        both_in, go = asyncio.Event(), asyncio.Event()

        async def wait(request: Request) -> JSONResponse:
            seen.append((in_flight.count, in_flight.alone))
            if in_flight.count == 2:
                both_in.set()
            await go.wait()
            return JSONResponse({})

        async def fail(request: Request) -> JSONResponse:
            raise RuntimeError("boom")

        app = CountInFlight(
            Starlette(routes=[Route("/wait", wait), Route("/fail", fail)]), in_flight
        )
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = asyncio.create_task(client.get("/wait"))
            await asyncio.sleep(0.05)
            second = asyncio.create_task(client.get("/wait"))
            await asyncio.wait_for(both_in.wait(), 5)
            go.set()
            await asyncio.gather(first, second)
            assert in_flight.count == 0
            assert (await client.get("/fail")).status_code == 500
            assert in_flight.count == 0  # a failing request is counted out too

    asyncio.run(main())
    assert seen == [(1, True), (2, False)]
