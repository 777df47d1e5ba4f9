"""Internal routes: the server's engine lent to Reef's own processes, never recorded as traffic.

The learning worker (the proposer, a judge, the gate's paired evaluation) and `reef release
publish` run their requests here instead of loading a second copy of the model. The caller
applies the binding (a harness's prompt and settings) itself and names the adapter and
checkpoint folders, which must lie inside the state folder. Only the internal token (or an
admin token) may call them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.inference.model import INTERNAL_COMPLETE_PATH, artifact_inside, completion_json
from reef.protocol import ChatRequest
from reef.server.cancellation import until_disconnected
from reef.server.http import parse, read_json
from reef.server.state import ServerState


class InternalComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: ChatRequest
    adapter: str | None = None
    checkpoint: str | None = None


async def complete(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    body = parse(InternalComplete, await read_json(request, state.config.server.max_body_bytes))
    adapter = artifact_inside(body.adapter, state.config.state_dir)
    checkpoint = artifact_inside(body.checkpoint, state.config.state_dir, "checkpoint")
    completion = await until_disconnected(
        request, state.engine.complete(body.request, adapter, checkpoint)
    )
    return JSONResponse(completion_json(completion))


routes = [Route(INTERNAL_COMPLETE_PATH, complete, methods=["POST"])]
