"""Reading a prompt from an empty cache on the two attention paths the speed benchmarks compare:
Reef's (64-token blocks, q8_0 keys, no flash attention) and llama-server's (512-token batches,
flash attention, f16 keys)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common.formats import N_THREADS
from reef.engines.llamacpp.context import GGML_CACHE_TYPES, read_blocks
from reef.engines.llamacpp.weights import model_params


@dataclass(frozen=True)
class AttentionPath:
    name: str
    block: int  # tokens per llama_decode
    flash: bool
    cache_k: str
    cache_v: str


PATHS = (
    AttentionPath("reef", 64, False, "q8_0", "f16"),
    AttentionPath("flash", 512, True, "f16", "f16"),
)


def prompt_seconds(path: Path, attention: AttentionPath, tokens: int, rounds: int) -> float:
    """The best of `rounds` timings of one `tokens`-long prompt read from an empty cache."""
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = tokens + 256
    params.n_batch = params.n_ubatch = attention.block
    params.n_threads = params.n_threads_batch = N_THREADS
    params.type_k = GGML_CACHE_TYPES[attention.cache_k]
    params.type_v = GGML_CACHE_TYPES[attention.cache_v]
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if attention.flash
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    context = llama_cpp.llama_init_from_model(model, params)
    try:
        best = float("inf")
        for round_ in range(rounds):
            draw = random.Random(round_)  # tokens of ordinary words, another prompt each round
            prompt = [draw.randrange(1000, 40000) for _ in range(tokens)]
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), True)
            started = time.perf_counter()
            read_blocks(context, prompt, attention.block)
            best = min(best, time.perf_counter() - started)
        return best
    finally:
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)
