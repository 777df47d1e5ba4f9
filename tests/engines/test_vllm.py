"""The vLLM engine's contract: CUDA check, child process protocol, clean shutdown.

Real vLLM did not run here: it needs a CUDA GPU, and CI has none. The protocol tests drive the
engine against a stand-in executable that takes `vllm serve MODEL --enable-lora --host H --port P`
and serves vLLM's documented endpoints (`/health`, OpenAI `/v1/chat/completions`) with the
project's loopback OpenAI peer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from reef.engines.vllm import VLLMEngine, cuda_available
from reef.errors import EngineUnavailable
from reef.protocol import ChatRequest
from reef.testing.processes import free_port, run_reef

STAND_IN = """#!{python}
import json, os, sys
from pathlib import Path
Path({argv_file!r}).write_text(json.dumps(sys.argv[1:]))
{behaviour}
"""
# As vLLM documents it: /v1 routes need the key from VLLM_API_KEY (or --api-key), and
# /v1/load_lora_adapter exists only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.
SERVES = """
import uvicorn
from starlette.responses import JSONResponse
from reef.testing.openai_peer import app as peer

key = os.environ.get("VLLM_API_KEY")
runtime_lora = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
loads = []

async def app(scope, receive, send):
    path = scope.get("path", "")
    if path == "/peer/load_count":
        return await JSONResponse(len(loads))(scope, receive, send)
    if path.startswith("/v1"):
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        if not key or sent != f"Bearer {key}":
            return await JSONResponse({"error": "bad key"}, 401)(scope, receive, send)
    if path == "/v1/load_lora_adapter":
        if not runtime_lora:
            return await JSONResponse({"detail": "Not Found"}, 404)(scope, receive, send)
        loads.append(path)
    await peer(scope, receive, send)

port = int(sys.argv[sys.argv.index("--port") + 1])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""
CRASHES = "print('CUDA error: no kernel image is available'); sys.exit(3)"


def stand_in(folder: Path, behaviour: str) -> tuple[Path, Path]:
    argv_file = folder / "argv.json"
    script = folder / "vllm"
    script.write_text(
        STAND_IN.format(python=sys.executable, argv_file=str(argv_file), behaviour=behaviour)
    )
    script.chmod(0o755)
    return script, argv_file


def test_without_cuda_start_fails_before_spawning(tmp_path: Path) -> None:
    script, argv_file = stand_in(tmp_path, SERVES)
    engine = VLLMEngine(model="m", executable=str(script), has_cuda=lambda: False)
    with pytest.raises(EngineUnavailable, match="needs a CUDA GPU"):
        asyncio.run(engine.start())
    assert not argv_file.exists()


@pytest.mark.skipif(cuda_available(), reason="this machine has CUDA")
def test_reef_serve_engine_vllm_says_cuda_is_missing(tmp_path: Path) -> None:
    result = run_reef(
        tmp_path, "serve", "--engine", "vllm", "--model", "some/model", "--port", str(free_port())
    )
    assert result.returncode == 1
    assert "needs a CUDA GPU" in result.stderr


def test_child_is_started_with_lora_enabled_served_and_stopped(tmp_path: Path) -> None:
    script, argv_file = stand_in(tmp_path, SERVES)
    port = free_port()
    engine = VLLMEngine(
        model="org/model",
        executable=str(script),
        port=port,
        extra_args=["--max-model-len", "2048"],
        has_cuda=lambda: True,
        log_path=tmp_path / "state" / "vllm.log",
    )

    async def scenario() -> dict:
        await engine.start()
        try:
            request = ChatRequest.model_validate(
                {"messages": [{"role": "user", "content": "ping"}]}
            )
            completion = await engine.complete(request)
            # A LoRA release: loaded once through /v1/load_lora_adapter, then requested by name.
            adapter = tmp_path / "lora"
            adapter.mkdir()
            # Two first requests at once still load the adapter once.
            await asyncio.gather(
                engine.complete(request, adapter=adapter),
                engine.complete(request, adapter=adapter),
            )
            with_lora = await engine.complete(request, adapter=adapter)
            assert httpx.get(f"http://127.0.0.1:{port}/peer/load_count").json() == 1
            loaded = httpx.get(f"http://127.0.0.1:{port}/peer/adapters").json()
            assert list(loaded.values()) == [str(adapter)]
            assert with_lora.response["model"] == next(iter(loaded))
            items = [
                item async for item in engine.stream(request.model_copy(update={"stream": True}))
            ]
            assert items[-1].response["choices"][0]["message"]["content"].strip() == "echo: ping"
            return completion.response
        finally:
            process = engine._process
            await engine.close()
            assert process is not None and process.poll() is not None

    response = asyncio.run(scenario())
    assert response["choices"][0]["message"]["content"] == "echo: ping"
    assert response["model"] == "org/model"
    argv = json.loads(argv_file.read_text())
    assert argv[:3] == ["serve", "org/model", "--enable-lora"]
    assert argv[argv.index("--port") + 1] == str(port)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[-2:] == ["--max-model-len", "2048"]
    assert not any("key" in arg for arg in argv)  # the key travels in the environment only
    assert (tmp_path / "state" / "vllm.log").is_file()


def test_child_that_dies_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    script, _ = stand_in(tmp_path, CRASHES)
    engine = VLLMEngine(model="m", executable=str(script), port=free_port(), has_cuda=lambda: True)
    with pytest.raises(EngineUnavailable, match="exited with code 3") as error:
        asyncio.run(engine.start())
    assert "no kernel image" in str(error.value)
    assert engine._session is None and engine._client is None  # its HTTP clients were closed


def test_parallelism_and_multi_lora_settings_become_the_childs_flags(tmp_path: Path) -> None:
    """As vLLM documents its flags; real vLLM did not run here (no GPU)."""
    from reef.config import EngineConfig
    from reef.engines import build_engine
    from reef.errors import ConfigurationRefused

    settings = {
        "model": "org/model",
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "distributed_executor": "ray",
        "max_loras": 8,
        "max_lora_rank": 64,
        "extra_args": ["--max-model-len", "4096"],
    }
    config = EngineConfig.model_validate({"kind": "vllm", "vllm": settings})
    command = build_engine(config, 8, tmp_path).command()
    flags = dict(zip(command[4::2], command[5::2], strict=False))  # after serve MODEL --enable-lora
    assert flags["--tensor-parallel-size"] == "4" and flags["--pipeline-parallel-size"] == "2"
    assert flags["--distributed-executor-backend"] == "ray"
    assert flags["--max-loras"] == "8" and flags["--max-lora-rank"] == "64"
    assert command[-2:] == ["--max-model-len", "4096"]  # the user's own flags come last
    plain = EngineConfig.model_validate({"kind": "vllm", "vllm": {"model": "org/model"}})
    assert not {"--tensor-parallel-size", "--max-loras"} & set(
        build_engine(plain, 8, tmp_path).command()
    )  # vLLM's own defaults where nothing is set
    settings["extra_args"] = ["--tensor-parallel-size", "2"]
    clash = EngineConfig.model_validate({"kind": "vllm", "vllm": settings})
    with pytest.raises(ConfigurationRefused, match="take --tensor-parallel-size out of extra"):
        build_engine(clash, 8, tmp_path)


def test_an_adapter_is_copied_where_every_vllm_node_reads_it_before_it_is_loaded(
    tmp_path: Path,
) -> None:
    """With `adapter_dir` (a shared filesystem), vLLM is asked to load the adapter from there,
    where workers on other nodes find it; against the stand-in, not real vLLM."""
    script, _ = stand_in(tmp_path, SERVES)
    port = free_port()
    shared = tmp_path / "shared-adapters"
    engine = VLLMEngine(
        model="org/model",
        executable=str(script),
        port=port,
        has_cuda=lambda: True,
        adapter_dir=shared,
    )
    adapter = tmp_path / "release" / "peft"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')

    async def scenario() -> dict:
        await engine.start()
        try:
            request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
            await engine.complete(request, adapter=adapter.parent)
            return httpx.get(f"http://127.0.0.1:{port}/peer/adapters").json()
        finally:
            await engine.close()

    (loaded,) = asyncio.run(scenario()).values()
    assert Path(loaded).parent == shared  # not the release checkout on this machine
    assert (Path(loaded) / "adapter_config.json").read_text() == '{"r": 8}'
