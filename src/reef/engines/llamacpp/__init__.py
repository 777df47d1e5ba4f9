"""The llama.cpp engine: a GGUF model in process, requests decoded together in slots of its KV
cache with their prompt caches.

Its parts, one job each: `engine` (the Engine: checks and tokenizes requests, hands them to the
loop, shapes completions), `loop` (the thread that owns the llama.cpp context: continuous
batching), `context` (that context: a KV stream per slot, the cache's types), `slots` (the KV
slots and prompt cache), `handover` (prompts read on other weights, their KV handed to a slot),
`prefill_weights` (which weights read prompts), `sampling` (each sequence's sampler and
logprobs), `output` (one choice's text and stream deltas), `structured` (JSON schemas and forced
tool calls as grammars), `repetition` (an answer that loops), `weights` (loading the model with
kernels that run here), `convert` (a GGUF written in another format), `prepare` (a copy in a
faster weight format, checked against the file), `adapters` (LoRA adapters in the context),
`embeddings`. Each llama.cpp call's thread count is chosen by `reef.threads`.
"""

from reef.engines.llamacpp.context import CacheTypes, batch_context
from reef.engines.llamacpp.engine import (
    Cancelled,
    LlamaCppEngine,
    Preempted,
    embedded_model_path,
)

__all__ = [
    "CacheTypes",
    "Cancelled",
    "LlamaCppEngine",
    "Preempted",
    "batch_context",
    "embedded_model_path",
]
