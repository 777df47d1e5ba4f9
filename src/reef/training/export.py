"""A trained adapter as a release folder: a PEFT folder and a llama.cpp GGUF LoRA adapter.

    folder/peft/adapter_config.json, adapter_model.safetensors   vLLM, and resuming training
    folder/adapter.gguf                                          llama.cpp (hot-swap)

The GGUF adapter holds, for each adapted projection of each layer, `lora_a` = peft's lora_A
(rank x in) and `lora_b` = peft's lora_B (out x rank), F32, named after llama.cpp's tensors.
llama.cpp scales the product by `adapter.lora.alpha / rank`, as peft does by `lora_alpha / r`.

One correction is not a rename: llama.cpp's converter stores Wq and Wk with their rows permuted
(each head's rotary halves interleaved), so a LoRA's update to them, B @ A, must reach llama.cpp
with B's rows permuted the same way (q over the attention heads, k over the key-value heads).
Without it the top token often survives while the logits are wrong.

The folder appears by one rename of a finished temporary folder: an export that is killed leaves
no half-written adapter (at most a `.NAME.partial-*` folder beside it, safe to delete).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from peft import LoraConfig, PeftModel
from peft.tuners.lora import LoraLayer
from torch import nn

from reef.errors import Conflict, Unsupported
from reef.training.lora import TrainedAdapter

# peft's module names for a llama block, and llama.cpp's tensor names for them.
GGUF_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
_BLOCK_MODULE = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


@dataclass
class GgufLora:
    alpha: float
    tensors: dict[str, np.ndarray]  # GGUF name -> float32 array, in writing order


def export_adapter(trained: TrainedAdapter, folder: Path) -> None:
    """Write `folder/peft/` and `folder/adapter.gguf`, all at once or not at all."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise Conflict(f"{folder} already exists and is not empty: export into a new folder")
    converted = gguf_lora(trained.model)  # before anything is written: it may refuse
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        partial.mkdir()
        trained.model.save_pretrained(str(partial / "peft"))
        (partial / "peft" / "README.md").unlink(missing_ok=True)  # peft's blank model card
        write_gguf_lora(converted, partial / "adapter.gguf")
        os.replace(partial, folder)  # an empty folder there is replaced, atomically
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def gguf_lora(model: PeftModel, permute_qk: bool = True) -> GgufLora:
    """The active adapter's tensors as llama.cpp names and lays them out.

    `permute_qk=False` leaves q and k unpermuted: wrong for llama.cpp, there so a test can
    show that the permutation is needed.
    """
    config = model.config
    if config.model_type != "llama":
        raise Unsupported(
            f"GGUF LoRA export knows the llama architecture only, not {config.model_type!r}; "
            "the PEFT adapter alone can serve on vLLM"
        )
    name = model.active_adapter
    settings = model.peft_config[name]
    if not isinstance(settings, LoraConfig):
        raise Unsupported(f"adapter {name!r} is not a LoRA: llama.cpp adapters hold LoRA only")
    alpha = float(settings.lora_alpha)
    found: list[tuple[int, int, str, np.ndarray, np.ndarray]] = []
    for path, module in model.named_modules():
        if not isinstance(module, LoraLayer) or name not in module.lora_A:
            continue
        layer, projection = _block_position(path)
        variant = getattr(module, "lora_variant", {}).get(name)  # DoRA and kin (peft >= 0.17)
        if variant is not None or module.use_dora.get(name) or module.lora_bias.get(name):
            raise Unsupported(f"{path}: llama.cpp adapters hold plain LoRA only (no DoRA, no bias)")
        a, b = _weight(module.lora_A[name]), _weight(module.lora_B[name])
        # llama.cpp scales by alpha / rank; fold any other peft scaling (rslora, alpha
        # patterns) into B so the product comes out the same.
        b = b * (float(module.scaling[name]) / (alpha / a.shape[0]))
        if permute_qk and projection == "q_proj":
            b = permute_rows(b, config.num_attention_heads)
        if permute_qk and projection == "k_proj":
            b = permute_rows(b, config.num_key_value_heads)
        order = list(GGUF_NAMES).index(projection)
        found.append((layer, order, f"blk.{layer}.{GGUF_NAMES[projection]}.weight", a, b))
    if not found:
        raise Unsupported("the model carries no LoRA weights to export")
    tensors: dict[str, np.ndarray] = {}
    for _layer, _order, base_name, a, b in sorted(found, key=lambda item: item[:2]):
        tensors[f"{base_name}.lora_a"] = np.ascontiguousarray(a, dtype=np.float32)
        tensors[f"{base_name}.lora_b"] = np.ascontiguousarray(b, dtype=np.float32)
    return GgufLora(alpha=alpha, tensors=tensors)


def permute_rows(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's Wq/Wk permutation (`LlamaModel.permute`), applied to rows."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf_lora(lora: GgufLora, path: Path) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")  # general.architecture
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora.alpha)
    for name, tensor in lora.tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _weight(linear: nn.Module) -> np.ndarray:
    weight = linear.weight
    assert isinstance(weight, torch.Tensor)
    return weight.detach().float().cpu().numpy()


def _block_position(path: str) -> tuple[int, str]:
    match = _BLOCK_MODULE.search(path)
    if match is None or match.group(2) not in GGUF_NAMES:
        raise Unsupported(
            f"{path}: llama.cpp adapters cover the block projections only ({', '.join(GGUF_NAMES)})"
        )
    return int(match.group(1)), match.group(2)
