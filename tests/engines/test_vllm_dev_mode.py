"""vLLM's dev-mode routes answer Reef alone: the key is asked for on every path.

Real vLLM did not run here (it needs a CUDA GPU). The stand-in serves as vLLM 0.33's source does:
its own `AuthenticationMiddleware` checks the key only on paths under `GUARDED_PREFIX`
(`vllm/entrypoints/serve/middleware/authenticate.py`), the dev-mode routes (`/collective_rpc`,
`/reset_prefix_cache`, `/server_info`) exist at the root with `VLLM_SERVER_DEV_MODE=1`, and each
`--middleware` import path is imported and wraps the app, outside vLLM's own
(`init_entrypoints_middleware`). The guard it loads is the one Reef writes, from the folder Reef
puts on the child's PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import httpx

from reef.engines.vllm import GUARD_MIDDLEWARE, VLLMEngine
from reef.protocol import ChatRequest
from reef.testing.processes import free_port
from tests.engines.test_vllm import stand_in

AS_VLLM_SERVES = """
import importlib
import inspect
import uvicorn
from starlette.responses import JSONResponse
from reef.testing.openai_peer import app as peer

key = os.environ.get("VLLM_API_KEY")
dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
calls = []

async def routes(scope, receive, send):
    path = scope.get("path", "")
    if dev_mode and path in ("/collective_rpc", "/reset_prefix_cache", "/server_info"):
        calls.append(path)
        return await JSONResponse({"results": [None]})(scope, receive, send)
    if path == "/peer/dev_calls":
        return await JSONResponse(calls)(scope, receive, send)
    await peer(scope, receive, send)

def vllm_authentication(app):
    async def guarded(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIX):
            sent = dict(scope["headers"]).get(b"authorization", b"").decode()
            if not key or sent != f"Bearer {key}":
                return await JSONResponse({"error": "Unauthorized"}, 401)(scope, receive, send)
        await app(scope, receive, send)
    return guarded

app = vllm_authentication(routes)
args = sys.argv[1:]
for index, arg in enumerate(args):
    if arg == "--middleware":
        module_path, name = args[index + 1].rsplit(".", 1)
        imported = getattr(importlib.import_module(module_path), name)
        assert inspect.isclass(imported)
        app = imported(app)

port = int(sys.argv[sys.argv.index("--port") + 1])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""

DEV_ROUTES = [
    ("POST", "/collective_rpc", {"method": "reload_weights"}),
    ("POST", "/reset_prefix_cache", None),
    ("GET", "/server_info", None),
]


def ask(text: str) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": text}]})


def test_another_local_process_reaches_no_path_of_the_child_without_its_key(
    tmp_path: Path,
) -> None:
    script, argv_file = stand_in(tmp_path, AS_VLLM_SERVES)
    port = free_port()
    engine = VLLMEngine(model="org/model", executable=str(script), port=port, has_cuda=lambda: True)
    root = f"http://127.0.0.1:{port}"
    weights = tmp_path / "default@2" / "checkpoint"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"model_type": "llama"}')

    async def scenario() -> tuple[list[int], list[int], list[str], Path]:
        await engine.start()  # ready: Reef's own /health poll carries the key
        guard = engine._guard_dir
        assert guard is not None
        try:
            outsider, wrong_key = [], []
            async with httpx.AsyncClient() as client:
                for method, route, body in [*DEV_ROUTES, ("GET", "/health", None)]:
                    response = await client.request(method, root + route, json=body)
                    outsider.append(response.status_code)
                    wrong = {"Authorization": "Bearer not-the-key"}
                    response = await client.request(method, root + route, json=body, headers=wrong)
                    wrong_key.append(response.status_code)
            # Reef's own calls go through: a checkpoint reload, then a chat request.
            answer = await engine.complete(ask("on the checkpoint"), checkpoint=weights)
            assert answer.response["choices"][0]["message"]["content"] == "echo: on the checkpoint"
            key = {"Authorization": f"Bearer {engine._child_api_key}"}
            calls = httpx.get(root + "/peer/dev_calls", headers=key).json()
            assert stat.S_IMODE(guard.stat().st_mode) == 0o700  # only this user reads the guard
            return outsider, wrong_key, calls, guard
        finally:
            await engine.close()

    outsider, wrong_key, calls, guard = asyncio.run(scenario())
    assert outsider == [401, 401, 401, 401]  # the dev-mode routes and /health, without a key
    assert wrong_key == [401, 401, 401, 401]
    assert calls == ["/collective_rpc", "/collective_rpc", "/reset_prefix_cache"]  # only Reef's
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("--middleware") + 1] == GUARD_MIDDLEWARE
    assert not any(engine._child_api_key in arg for arg in argv)  # the key: environment only
    assert not guard.exists()  # removed with the child
