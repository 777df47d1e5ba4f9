"""The least a Python proxy can do: forward each POST's bytes to the upstream and its answer back.

An aiohttp server on uvloop with one pooled aiohttp client (the stack Reef's proxy path uses),
no parsing, no validation, no record, no log line. `python -m bench.speed.proxy` measures it beside
Reef:
its added latency over the direct call is what one Python hop costs on this machine, the floor
under Reef's.

    python -m bench.common.proxy.bare_forwarder --port 9200 --upstream http://127.0.0.1:9100
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web

FORWARDED = ("authorization", "content-type")


def app(upstream: str) -> web.Application:
    application = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def open_session(_: web.Application) -> None:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)))

    async def close_session(_: web.Application) -> None:
        await sessions[0].close()

    async def forward(request: web.Request) -> web.Response:
        headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
        body = await request.read()
        async with sessions[0].post(upstream + request.path, data=body, headers=headers) as reply:
            content = await reply.read()
            kind = reply.headers.get("content-type", "application/json")
            return web.Response(body=content, status=reply.status, content_type=kind.split(";")[0])

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    application.on_startup.append(open_session)
    application.on_cleanup.append(close_session)
    application.router.add_post("/{path:.*}", forward)
    application.router.add_get("/v1/models", models)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's origin, no path")
    options = parser.parse_args()
    uvloop.install()
    web.run_app(app(options.upstream), host="127.0.0.1", port=options.port, access_log=None)


if __name__ == "__main__":
    main()
