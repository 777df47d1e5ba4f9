"""Serving engines behind one small interface (`reef.engines.base.Engine`)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from reef.config import EngineConfig
from reef.engines.base import Capabilities, Engine
from reef.errors import EngineUnavailable

__all__ = [
    "Capabilities",
    "Engine",
    "build_engine",
    "resolve_kind",
    "served_model_path",
]

log = logging.getLogger("reef.engine")


def resolve_kind(config: EngineConfig) -> tuple[str, str]:
    """The engine kind to run and why: `auto` takes vLLM with CUDA and vLLM, else llama.cpp."""
    if config.kind != "auto":
        return config.kind, "chosen in the configuration"
    from reef.engines.vllm import cuda_available

    if importlib.util.find_spec("vllm") is not None and cuda_available():
        return "vllm", "auto: CUDA and vLLM are present"
    return "llamacpp", "auto: no CUDA GPU with vLLM here, so llama.cpp on the CPU"


def served_model_path(config: EngineConfig) -> Path | None:
    """The weights the configured engine serves, for recipes that train on them: a GGUF file
    (llama.cpp) or a model folder (vLLM); None for an upstream engine, whose weights are remote."""
    kind, _ = resolve_kind(config)
    if kind == "llamacpp":
        from reef.engines.llamacpp import embedded_model_path

        model = config.llamacpp.model
        return Path(model).expanduser() if model else embedded_model_path()
    if kind == "vllm":
        model = config.vllm.model or config.llamacpp.model
        return Path(model).expanduser() if model and Path(model).expanduser().exists() else None
    return None


def _llamacpp_weights(source: Path, config: EngineConfig, state_dir: Path | None) -> Path:
    """The GGUF llama.cpp loads for `source`: the file, or the copy `reef model prepare` made of
    it under `state_dir` (see engines/llamacpp/prepare.py)."""
    if not config.llamacpp.prepared or state_dir is None or not source.is_file():
        return source
    from reef.engines.llamacpp.prepare import prepared_copy

    copy = prepared_copy(source, state_dir)
    if copy is None:
        return source
    log.info(
        "llama.cpp: serving %s, the %s copy of %s (reef model prepare: prompts %.0f tokens/s "
        "instead of %.0f; set engine.llamacpp.prepared: false to serve the file)",
        Path(copy.path).name,
        copy.format,
        source.name,
        copy.speed.prompt_tokens_per_s,
        copy.source_speed.prompt_tokens_per_s,
    )
    return Path(copy.path)


def build_engine(
    config: EngineConfig, max_queue: int = 16, state_dir: Path | None = None
) -> Engine:
    """The configured engine, not started. `max_queue`: requests an engine holds waiting beyond
    those it runs (server.max_queue); `state_dir`: where a child engine writes its log."""
    kind, _ = resolve_kind(config)
    if kind == "llamacpp":
        from reef.engines.llamacpp import CacheTypes, LlamaCppEngine, embedded_model_path
        from reef.engines.llamacpp.prefill_weights import parse_setting

        llama = config.llamacpp
        source = Path(llama.model).expanduser() if llama.model else embedded_model_path()
        engine = LlamaCppEngine(
            model_path=_llamacpp_weights(source, config, state_dir),
            n_ctx=llama.n_ctx,
            n_threads=llama.n_threads,
            n_batch=llama.n_batch,
            default_max_tokens=llama.default_max_tokens,
            max_tokens_cap=llama.max_tokens_cap,
            max_queue=max_queue,
            slots=llama.slots,
            repack=llama.repack,
            stop_loops=llama.stop_loops,
            adaptive_threads=llama.adaptive_threads,
            cache=CacheTypes(llama.cache_type_k, llama.cache_type_v),
            prefill_weights=parse_setting(llama.prefill_weights),
        )
        if engine.model_path != source:  # a prepared copy: clients keep the file's name
            engine.name_override = source.name.removesuffix(".gguf")
        return engine
    if kind == "upstream":
        from reef.engines.upstream import UpstreamEngine

        upstream = config.upstream
        if not upstream.url:
            raise EngineUnavailable(
                "the upstream engine needs a base URL: set engine.upstream.url, REEF_UPSTREAM_URL "
                "or --upstream-url (for example http://127.0.0.1:8000/v1)"
            )
        return UpstreamEngine(
            base_url=upstream.url,
            model=upstream.model,
            api_key=upstream.api_key.get_secret_value() if upstream.api_key else None,
            timeout_s=upstream.timeout_s,
        )
    from reef.engines.vllm import VLLMEngine, parallel_args

    vllm = config.vllm
    model = vllm.model or config.llamacpp.model
    if not model:
        raise EngineUnavailable(
            "the vllm engine needs a model: set engine.vllm.model (a Hugging Face id or a local "
            "folder) or --model"
        )
    return VLLMEngine(
        model=model,
        executable=vllm.executable,
        port=vllm.port,
        extra_args=[*parallel_args(vllm), *vllm.extra_args],
        startup_timeout_s=vllm.startup_timeout_s,
        log_path=state_dir / "vllm.log" if state_dir else None,
        adapter_dir=vllm.adapter_dir,
    )
