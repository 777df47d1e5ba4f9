"""vLLM as a child process: `vllm serve MODEL --enable-lora`, then forwarded to over HTTP.

vLLM needs CUDA. Without it, start-up stops with a message saying so, before anything is spawned.
The child is started on loopback, polled on `/health` until ready, and terminated on shutdown.
It runs with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (without it `/v1/load_lora_adapter` does not
exist) and a fresh API key in `VLLM_API_KEY` (vLLM's environment form of `--api-key`, which keeps
the key out of the process list), and writes its log to `vllm.log` in the state folder.

Past one GPU, the settings vLLM documents are Reef settings (`engine.vllm.tensor_parallel_size`,
`pipeline_parallel_size`, `distributed_executor`, `max_loras`, `max_lora_rank`), passed to the
child as its flags (`parallel_args`). With workers on several nodes, `adapter_dir` names a folder
they all read: a release's adapter is copied there before vLLM is asked to load it.

A checkpoint release (full weights, a Hugging Face folder under `checkpoint/`) serves through
vLLM's weight reload, which its server exposes with `VLLM_SERVER_DEV_MODE=1` (set for the child):
`POST /collective_rpc` with `update_config` (the model path) and then `reload_weights`, then
`POST /reset_prefix_cache` so no prompt cached under the old weights is reused. A vLLM process holds
one set of weights: the switch waits for the requests running on the old ones to finish and
holds new requests until it is done, so no answer mixes two sets. Scenarios serving different
checkpoints on one vLLM therefore take turns; give each its own vLLM (a replica) if they are
busy at once.

vLLM's API key guards only some paths: its `AuthenticationMiddleware`
(`vllm/entrypoints/serve/middleware/authenticate.py`, earlier in
`vllm/entrypoints/openai/api_server.py`) checks the key on paths under `GUARDED_PREFIX`
(`/v1`, `/v2`, `/inference`, `/cohere`; `/v1` alone before) and lets every other path through,
and the dev-mode routes (`/collective_rpc`, `/reset_prefix_cache`, `/sleep`, `/server_info`, ...)
are mounted at the root. On loopback any local user could call them: run any worker method,
load other weights, read the server's configuration. So the child gets a middleware of Reef's,
through vLLM's own `--middleware` flag (an import path vLLM adds to its app), that asks for the
key on every path, `/health` included, and closes a websocket without it: `GUARD`, written to a
folder only this user reads and put on the child's `PYTHONPATH`. A guard that does not load
stops vLLM at start-up, so the child never serves unguarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from reef.engines.base import Capabilities
from reef.engines.upstream import UpstreamEngine
from reef.errors import ConfigurationRefused, EngineUnavailable, ReefError, Unsupported

if TYPE_CHECKING:
    from reef.config import VLLMConfig


log = logging.getLogger("reef.engine")
GUARD_MODULE = "reef_vllm_guard"
GUARD_MIDDLEWARE = f"{GUARD_MODULE}.KeyOnEveryPath"
# The guard vLLM loads (`--middleware reef_vllm_guard.KeyOnEveryPath`): plain ASGI and the
# standard library only, so it loads in whatever environment vLLM is installed in.
GUARD = '''"""Written by Reef: vLLM's API key on every path (vLLM's own guards a few)."""
import hashlib
import hmac
import os

_DENIED = b'{"error": "Unauthorized"}'


class KeyOnEveryPath:
    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY")
        if not key:
            raise RuntimeError("reef_vllm_guard: VLLM_API_KEY is not set")
        self._key = hashlib.sha256(key.encode()).digest()

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and not self._allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": _DENIED})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope):
        sent = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                sent = value
        scheme, _, token = sent.partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        return scheme.lower() == b"bearer" and hmac.compare_digest(digest, self._key)
'''


def cuda_available() -> bool:
    """True when torch sees a CUDA device, or, without torch, when `nvidia-smi -L` lists one."""
    try:
        import torch
    except ImportError:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return False
        result = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
        return result.returncode == 0 and "GPU" in result.stdout
    return bool(torch.cuda.is_available())


def peft_folder(adapter: Path) -> Path:
    """The PEFT adapter vLLM loads: the folder itself, or its `peft/` (as `reef.training`
    exports a LoRA release: `peft/` beside `adapter.gguf`)."""
    nested = adapter / "peft"
    return nested if (nested / "adapter_config.json").is_file() else adapter


# Reef setting -> the `vllm serve` flag it becomes.
PARALLEL_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "distributed_executor": "--distributed-executor-backend",
    "max_loras": "--max-loras",
    "max_lora_rank": "--max-lora-rank",
}


def parallel_args(config: VLLMConfig) -> list[str]:
    """The `vllm serve` flags of the parallelism and multi-LoRA settings that differ from vLLM's
    defaults; a flag also given in `extra_args` is refused (which would win is unclear)."""
    args: list[str] = []
    for setting, flag in PARALLEL_FLAGS.items():
        value = getattr(config, setting)
        if value is None or (setting.endswith("_parallel_size") and value == 1):
            continue
        if flag in config.extra_args:
            raise ConfigurationRefused(
                f"engine.vllm.extra_args has {flag} and engine.vllm.{setting} is set: keep "
                f"engine.vllm.{setting} and take {flag} out of extra_args"
            )
        args += [flag, str(value)]
    return args


class VLLMEngine(UpstreamEngine):
    name = "vllm"
    # Responses are relayed as vLLM sends them; token ids and logprobs are not captured.
    capabilities = Capabilities(token_ids=False, logprobs=False)

    def __init__(
        self,
        model: str,
        executable: str = "vllm",
        port: int = 8901,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 900.0,
        has_cuda: Callable[[], bool] = cuda_available,
        log_path: Path | None = None,
        adapter_dir: Path | None = None,
    ) -> None:
        api_key = secrets.token_urlsafe(32)
        super().__init__(base_url=f"http://127.0.0.1:{port}/v1", model=model, api_key=api_key)
        self._child_api_key = api_key
        self.executable = executable
        self.port = port
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self._has_cuda = has_cuda
        self._process: subprocess.Popen[bytes] | None = None
        self._guard_dir: Path | None = None  # where the child's guard module is written
        self._log = log_path or Path(tempfile.gettempdir()) / f"reef-vllm-{port}.log"
        self._adapters: set[str] = set()
        self.adapter_dir = adapter_dir  # read by every vLLM node, when they are several
        self._adapter_lock = asyncio.Lock()  # two first requests for one adapter load it once
        # The full weights the child serves (None: the model it started with), the requests
        # running on them, and the weights a switch waits to load (see `_weights`).
        self._loaded_weights: Path | None = None
        self._running = 0
        self._switching_to: Path | bool | None = False  # False: no switch waiting
        self._weights_changed = asyncio.Condition()

    def command(self) -> list[str]:
        return [
            self.executable,
            "serve",
            self.model,
            "--enable-lora",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--middleware",
            GUARD_MIDDLEWARE,  # the key on every path, dev-mode routes included (see GUARD)
            *self.extra_args,
        ]

    async def start(self) -> None:
        if not self._has_cuda():
            raise EngineUnavailable(
                "the vllm engine needs a CUDA GPU and none was found; "
                "use --engine llamacpp (CPU) or --engine upstream"
            )
        if shutil.which(self.executable) is None:
            raise EngineUnavailable(
                f"{self.executable!r} was not found on PATH: install vLLM (`pip install vllm`) "
                "or set engine.vllm.executable"
            )
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._guard_dir = Path(tempfile.mkdtemp(prefix="reef-vllm-guard-"))  # mode 0700
        (self._guard_dir / f"{GUARD_MODULE}.py").write_text(GUARD)
        python_path = os.pathsep.join(
            [str(self._guard_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        environment = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc: weight reload, behind GUARD
            "VLLM_API_KEY": self._child_api_key,
            "PYTHONPATH": python_path,
        }
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=environment,
            )
        await super().start()
        try:
            await self._wait_until_ready()
        except BaseException:
            await self.close()  # a child that never became ready is stopped, not left running
            raise

    async def _wait_until_ready(self) -> None:
        health = f"http://127.0.0.1:{self.port}/health"
        deadline = asyncio.get_running_loop().time() + self.startup_timeout_s
        headers = {"Authorization": f"Bearer {self._child_api_key}"}  # the guard asks for it
        async with httpx.AsyncClient(timeout=2.0, headers=headers) as client:
            while True:
                assert self._process is not None
                if self._process.poll() is not None:
                    raise EngineUnavailable(
                        f"vllm exited with code {self._process.returncode} while starting; "
                        f"its log ends with:\n{self._log_tail()}"
                    )
                try:
                    if (await client.get(health)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise EngineUnavailable(
                        f"vllm did not become ready within {self.startup_timeout_s:.0f}s "
                        f"(log: {self._log})"
                    )
                await asyncio.sleep(0.5)

    async def _model_for(self, adapter: Path | None) -> str | None:
        """Adapters are loaded once through `/v1/load_lora_adapter`, then requested by name."""
        if adapter is None:
            return None
        name = f"reef-{hashlib.sha256(str(adapter).encode()).hexdigest()[:12]}"
        async with self._adapter_lock:
            if name not in self._adapters:
                await self._load_adapter(name, adapter)
        return name

    async def _load_adapter(self, name: str, adapter: Path) -> None:
        url = f"http://127.0.0.1:{self.port}/v1/load_lora_adapter"
        path = peft_folder(adapter)
        if self.adapter_dir is not None:
            path = await asyncio.to_thread(_shared_copy, path, self.adapter_dir / name)
        body = {"lora_name": name, "lora_path": str(path)}
        response = await self._http.post(url, json=body)
        if response.status_code >= 400:
            raise EngineUnavailable(
                f"vllm could not load the LoRA adapter {adapter}: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )
        self._adapters.add(name)

    @contextlib.asynccontextmanager
    async def _weights(self, checkpoint: Path | None) -> AsyncIterator[None]:
        """Run a request on `checkpoint`'s weights (None: the model vLLM started with),
        switching once the requests on the other weights have finished."""
        wanted = hugging_face_checkpoint(checkpoint) if checkpoint is not None else None
        async with self._weights_changed:
            while self._loaded_weights != wanted or self._switching_to is not False:
                if self._switching_to is False:
                    self._switching_to = wanted
                if self._switching_to == wanted and self._running == 0:
                    try:
                        await self._reload(wanted)
                    finally:
                        self._switching_to = False
                        self._weights_changed.notify_all()
                    continue
                await self._weights_changed.wait()
            self._running += 1
        try:
            yield
        finally:
            async with self._weights_changed:
                self._running -= 1
                self._weights_changed.notify_all()

    async def _reload(self, weights: Path | None) -> None:
        """vLLM's documented weight reload, from `weights` (None: the model it started with)."""
        path = str(weights) if weights is not None else self.model
        if weights is not None and self.adapter_dir is not None:
            name = f"reef-weights-{hashlib.sha256(path.encode()).hexdigest()[:12]}"
            path = str(await asyncio.to_thread(_shared_copy, weights, self.adapter_dir / name))
        root = f"http://127.0.0.1:{self.port}"
        steps = [
            (
                "/collective_rpc",
                {"method": "update_config", "args": [{"model_config": {"model": path}}]},
            ),
            ("/collective_rpc", {"method": "reload_weights"}),
            ("/reset_prefix_cache", None),
        ]
        for route, body in steps:
            response = await self._http.post(f"{root}{route}", json=body)
            if response.status_code >= 400:
                raise EngineUnavailable(
                    f"vllm could not load the weights {path} ({route}: HTTP "
                    f"{response.status_code} {response.text[:300]}); it still serves "
                    f"{self._loaded_weights or self.model}"
                )
        self._loaded_weights = weights

    async def child_metrics(self) -> bytes:
        """vLLM's own Prometheus metrics (its `vllm:` families: engine queue, KV cache, prefix
        cache, spec decode...), read from the child's `/metrics` with its key, for Reef's
        `/metrics` to pass through. Its other families (the Python process's, which Reef
        exports too) are left out, so no family appears twice. Empty when the child cannot say."""
        headers = {"Authorization": f"Bearer {self._child_api_key}"}
        try:
            response = await self._http.get(
                f"http://127.0.0.1:{self.port}/metrics", headers=headers, timeout=2.0
            )
            response.raise_for_status()
        except (httpx.HTTPError, ReefError) as error:
            log.warning("vllm's /metrics could not be read: %s", error)
            return b""
        return vllm_families(response.text).encode()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def close(self) -> None:
        await super().close()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        guard, self._guard_dir = self._guard_dir, None
        if guard is not None:
            shutil.rmtree(guard, ignore_errors=True)


def vllm_families(exposition: str) -> str:
    """The `vllm:` metric families of a Prometheus text exposition: their HELP, TYPE and
    sample lines."""
    kept = []
    for line in exposition.splitlines():
        words = line.split()
        if not words:
            continue
        name = words[2] if words[0] == "#" and len(words) > 2 else words[0].split("{", 1)[0]
        if name.startswith("vllm:") and (words[0] != "#" or words[1] in ("HELP", "TYPE")):
            kept.append(line)
    return "".join(f"{line}\n" for line in kept)


def hugging_face_checkpoint(checkpoint: Path) -> Path:
    """The Hugging Face folder of a checkpoint release (`checkpoint/` with config.json)."""
    if not (checkpoint / "config.json").is_file():
        raise Unsupported(
            f"checkpoint {checkpoint} has no Hugging Face model folder (config.json), which vLLM "
            "needs (a whole-model GGUF serves on llama.cpp)"
        )
    return checkpoint


def _shared_copy(folder: Path, destination: Path) -> Path:
    """`folder` copied to `destination` (whole or not at all: copied beside it, then renamed);
    an existing copy is kept, since its name is the adapter's."""
    if not destination.is_dir():
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}-"))
        try:
            shutil.copytree(folder, staging, dirs_exist_ok=True)
            staging.rename(destination)
        except OSError:
            if not destination.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return destination
