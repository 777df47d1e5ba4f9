"""Artifact folders for release tests: harness trees, a small random GGUF LoRA adapter, and a
checkpoint of SmolLM2-135M with that adapter merged in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def harness(
    folder: Path, prompt: str, settings: dict | None = None, rules: dict[str, str] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "AGENTS.md").write_text(prompt + "\n")
    if settings is not None:
        (folder / "settings.json").write_text(json.dumps(settings))
    for name, text in (rules or {}).items():
        (folder / "rules").mkdir(exist_ok=True)
        (folder / "rules" / f"{name}.md").write_text(text)
    return folder


def random_lora(
    folder: Path,
    rank: int = 8,
    scale: float = 0.5,
    seed: int = 0,
    n_embd: int = 576,
    layers: int = 4,
    targets: tuple[str, ...] = ("attn_q", "attn_output"),
) -> Path:
    """A LoRA adapter for SmolLM2-135M in llama.cpp's GGUF adapter format, random weights, on
    the `targets` of the first `layers` blocks (`KV_TARGETS`: the keys and values a prompt
    leaves in the cache, as a trained adapter's are).

    Big enough to change the model's answers; written with the `gguf` package.
    """
    import gguf

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "adapter.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    for name, tensor in random_lora_tensors(rank, scale, seed, n_embd, layers, targets).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (folder / "adapter.json").write_text(json.dumps({"rank": rank, "seed": seed}))
    return folder


def random_checkpoint(folder: Path, rank: int = 8, scale: float = 0.5, seed: int = 0) -> Path:
    """A checkpoint artifact: the embedded SmolLM2-135M with `random_lora`'s adapter (the same
    arguments give the same adapter) merged in, as `folder/checkpoint/model.gguf`."""
    from reef.engines.llamacpp import embedded_model_path
    from reef.training.checkpoint import CHECKPOINT_GGUF, merge_into_gguf
    from reef.training.export import GgufLora

    tensors = random_lora_tensors(rank, scale, seed)
    (folder / CHECKPOINT_GGUF).parent.mkdir(parents=True, exist_ok=True)
    merge_into_gguf(
        embedded_model_path(), GgufLora("llama", float(rank), tensors), folder / CHECKPOINT_GGUF
    )
    return folder


KV_TARGETS = ("attn_k", "attn_v")  # the projections whose output the KV cache holds
SMOLLM2_KV_WIDTH = 192  # SmolLM2-135M's keys and values: 3 KV heads of 64


def random_lora_tensors(
    rank: int = 8,
    scale: float = 0.5,
    seed: int = 0,
    n_embd: int = 576,
    layers: int = 4,
    targets: tuple[str, ...] = ("attn_q", "attn_output"),
) -> dict[str, np.ndarray]:
    """lora_a and lora_b of the first `layers` blocks' `targets`, seeded."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for tensor in targets:
            name = f"blk.{layer}.{tensor}.weight"
            width = SMOLLM2_KV_WIDTH if tensor in KV_TARGETS else n_embd
            a = (rng.standard_normal((rank, n_embd)) * scale).astype(np.float32)
            tensors[f"{name}.lora_a"] = a
            b = (rng.standard_normal((width, rank)) * scale).astype(np.float32)
            tensors[f"{name}.lora_b"] = b
    return tensors
