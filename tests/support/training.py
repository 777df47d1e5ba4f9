"""What the training tests share: one torch thread, the tiny random model's base, and llama.cpp's
logits to compare training's with."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from reef.engines.llamacpp.weights import load_model
from reef.testing.tiny import tiny_model_folder
from reef.training import Base, load_base


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: on a shared CPU two spin-wait for each other (docs/training.md), and a
    tiny model gains nothing from two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    """The 2-layer, 64-wide random llama, loaded as a training base."""
    folder = tmp_path_factory.mktemp("tiny")
    return load_base(tiny_model_folder(folder / "model"), folder / "cache")


def llama_cpp_last_logits(
    base: Path, prompt: list[int], adapters: list[Path | None], n_ctx: int = 64, threads: int = 1
) -> list[np.ndarray]:
    """llama.cpp's last-position logits for `prompt` on the GGUF `base`, once per adapter (None:
    the base alone), loaded and applied the way the llama.cpp engine does."""
    import llama_cpp
    from llama_cpp import _internals

    model = load_model(base)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
    params.n_threads = params.n_threads_batch = threads
    context = _internals.LlamaContext(model=model, params=params, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=len(prompt), embd=0, n_seq_max=1, verbose=False)
    rows, loaded = [], []
    try:
        for adapter in adapters:
            chosen, scales = None, None
            if adapter is not None:
                lora = llama_cpp.llama_adapter_lora_init(model.model, str(adapter).encode())
                assert lora, f"llama.cpp refused {adapter}"
                loaded.append(lora)
                chosen = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(lora)
                scales = (ctypes.c_float * 1)(1.0)
            count = 0 if adapter is None else 1
            assert llama_cpp.llama_set_adapters_lora(context.ctx, chosen, count, scales) == 0
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context.ctx), True)
            batch.reset()
            batch.add_sequence(prompt, 0, False)  # logits for the last position only
            context.decode(batch)
            pointer = llama_cpp.llama_get_logits_ith(context.ctx, -1)
            row = np.ctypeslib.as_array(
                ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (model.n_vocab(),)
            )
            rows.append(row.copy())
        llama_cpp.llama_set_adapters_lora(context.ctx, None, 0, None)
    finally:
        for lora in loaded:
            llama_cpp.llama_adapter_lora_free(lora)
        batch.close()
        context.close()
        model.close()
    return rows


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])
