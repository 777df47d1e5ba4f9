"""Embeddings on the llama.cpp model already loaded for chat: a second context, not a second model.

llama.cpp keeps the weights in the model and the KV cache in a context, so one loaded model can
have two contexts: the chat one (no embeddings) and this one, made with `embeddings=True` and mean
pooling over the input's tokens. The weights are shared; only this context's small cache is
extra. It is used on the engine's decode-loop thread, between two turns of the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reef.errors import Unsupported

# The most tokens one input may have: mean pooling needs the whole input in one batch.
EMBEDDING_WINDOW = 2048


def embedding_tokens(model: Any, text: str, window: int = EMBEDDING_WINDOW) -> list[int]:
    """`text`'s tokens, refused when longer than the window (thread-safe: reads the vocab)."""
    tokens = list(model.tokenize(text.encode("utf-8"), add_bos=True, special=False))
    if not text:
        raise Unsupported("an input is empty: embed text of at least one character")
    if len(tokens) > window:
        raise Unsupported(
            f"an input is {len(tokens)} tokens; embeddings take at most {window} per input: "
            "split it"
        )
    return tokens


def embedding_ids(ids: list[int], n_vocab: int, window: int = EMBEDDING_WINDOW) -> list[int]:
    """Token ids sent as an input (OpenAI's `input` as integers), checked against the model's
    vocabulary and the window."""
    if not ids:
        raise Unsupported("an input is empty: send at least one token id")
    if len(ids) > window:
        raise Unsupported(
            f"an input is {len(ids)} tokens; embeddings take at most {window} per input: split it"
        )
    wrong = next((token for token in ids if not 0 <= token < n_vocab), None)
    if wrong is not None:
        raise Unsupported(
            f"token id {wrong} is not in the model's vocabulary (ids are 0 to {n_vocab - 1})"
        )
    return list(ids)


class LlamaEmbedder:
    """Mean-pooled, L2-normalised embeddings from a loaded model (call on its worker thread)."""

    def __init__(self, model: Any, n_threads: int, window: int = EMBEDDING_WINDOW) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.window = window
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = window
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
        params.n_threads = params.n_threads_batch = n_threads
        self._context = _internals.LlamaContext(model=model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=window, embd=0, n_seq_max=1, verbose=False)
        self._n_embd = model.n_embd()

    def embed(self, tokens: list[int]) -> list[float]:
        import llama_cpp

        context = self._context.ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), True)
        self._batch.reset()
        self._batch.add_sequence(tokens, 0, True)
        self._context.decode(self._batch)
        pooled = llama_cpp.llama_get_embeddings_seq(context, 0)
        vector = np.array(pooled[: self._n_embd], dtype=np.float64)
        norm = float(np.linalg.norm(vector))
        return [float(x) for x in (vector / norm if norm else vector)]

    def close(self) -> None:
        self._batch.close()
        self._context.close()
