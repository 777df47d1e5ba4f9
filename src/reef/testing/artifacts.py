"""Artifact folders for release tests: harness trees and a small random GGUF LoRA adapter."""

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
) -> Path:
    """A LoRA adapter for SmolLM2-135M in llama.cpp's GGUF adapter format, random weights.

    Big enough to change the model's answers; written with the `gguf` package.
    """
    import gguf

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "adapter.gguf"
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    for layer in range(layers):
        for tensor in ("attn_q", "attn_output"):
            name = f"blk.{layer}.{tensor}.weight"
            writer.add_tensor(
                f"{name}.lora_a", (rng.standard_normal((rank, n_embd)) * scale).astype(np.float32)
            )
            writer.add_tensor(
                f"{name}.lora_b", (rng.standard_normal((n_embd, rank)) * scale).astype(np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (folder / "adapter.json").write_text(json.dumps({"rank": rank, "seed": seed}))
    return folder
