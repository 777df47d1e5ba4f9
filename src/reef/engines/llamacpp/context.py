"""The llama.cpp context the engine decodes in: one KV stream per slot, the cache's element types,
and what the cache takes in memory (see slots.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reef.engines.llamacpp.slots import BLOCK

CacheType = Literal["q8_0", "f16"]
GGML_CACHE_TYPES = {"q8_0": 8, "f16": 1}  # ggml_type: GGML_TYPE_Q8_0, GGML_TYPE_F16
_BYTES_PER_ELEMENT = {"q8_0": 34 / 32, "f16": 2.0}  # q8_0: 32 values in 32 bytes and a scale


@dataclass(frozen=True)
class CacheTypes:
    """The KV cache's element types, keys and values (llama.cpp's --cache-type-k and -v).

    Keys in q8_0 take half the memory of f16 and decode as fast or faster. Values can be q8_0
    only with flash attention, whose CPU kernels run long contexts about twice as slowly (an
    agent's 4,600-token prompt): so values stay f16 by default (docs/benchmarks.md)."""

    k: CacheType = "q8_0"
    v: CacheType = "f16"

    @property
    def flash_attention(self) -> bool:
        return self.v != "f16"

    def __str__(self) -> str:
        return f"K {self.k}, V {self.v}"


DEFAULT_CACHE = CacheTypes()


def batch_context(
    model: Any,
    n_ctx: int,
    slots: int,
    n_threads: int,
    cache: CacheTypes = DEFAULT_CACHE,
    batch: int = BLOCK,
) -> Any:
    """A context of `model` with one KV stream of `n_ctx` cells per slot (see
    slots.py), as the engine decodes in; `bench/speed/decode_ceiling.py` measures the same.
    `batch`: the most tokens one llama_decode takes (the engine's prompt blocks)."""
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx * slots
    params.n_seq_max = slots
    params.kv_unified = False
    params.n_batch = params.n_ubatch = max(batch, slots)
    params.n_threads = params.n_threads_batch = n_threads
    params.type_k, params.type_v = GGML_CACHE_TYPES[cache.k], GGML_CACHE_TYPES[cache.v]
    params.flash_attn_type = (  # llama.cpp quantises the V cache only with flash attention
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if cache.flash_attention
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    return _internals.LlamaContext(model=model, params=params, verbose=False)


def read_blocks(
    context: Any, tokens: list[int], block: int, seq_id: int = 0, start: int = 0
) -> None:
    """Read `tokens` into sequence `seq_id` of `context` (a llama_context pointer) from position
    `start`, `block` tokens per llama_decode, keeping the last token's logits
    (`llama_get_logits_ith(context, -1)`)."""
    import llama_cpp

    batch = llama_cpp.llama_batch_init(block, 0, 1)
    try:
        for offset in range(0, len(tokens), block):
            part = tokens[offset : offset + block]
            batch.n_tokens = len(part)
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i] = token, start + offset + i
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq_id
                batch.logits[i] = offset + i == len(tokens) - 1
            if (code := llama_cpp.llama_decode(context, batch)) != 0:
                raise RuntimeError(f"llama.cpp could not read a block of tokens (code {code})")
    finally:
        llama_cpp.llama_batch_free(batch)


def kv_cache_bytes(model: Any, cells: int, cache: CacheTypes) -> int:
    """The memory `cells` KV cells of `model` take in a cache of these types."""
    import llama_cpp

    handle = model.model
    head_dim = llama_cpp.llama_model_n_embd(handle) // llama_cpp.llama_model_n_head(handle)
    per_kind = llama_cpp.llama_model_n_layer(handle) * llama_cpp.llama_model_n_head_kv(handle)
    per_element = _BYTES_PER_ELEMENT[cache.k] + _BYTES_PER_ELEMENT[cache.v]
    return int(cells * per_kind * head_dim * per_element)
