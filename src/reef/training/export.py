"""A trained adapter as a release folder: a PEFT folder and a llama.cpp GGUF LoRA adapter.

    folder/peft/adapter_config.json, adapter_model.safetensors   vLLM, and resuming training
    folder/adapter.gguf                                          llama.cpp (hot-swap)

The GGUF adapter holds, for each adapted projection of each layer, `lora_a` = peft's lora_A
(rank x in) and `lora_b` = peft's lora_B (out x rank), F32, named as llama.cpp names the base
model's tensors: the `gguf` package's name map for the model's architecture, the one llama.cpp's
converter (convert_hf_to_gguf.py) uses. llama.cpp scales the product by
`adapter.lora.alpha / rank`, as peft does by `lora_alpha / r`.

The adapter must also follow the converter's changes to the base weights that are not renames.
For llama (and Mistral, which converts as llama) it stores Wq and Wk with their rows permuted
(each head's rotary halves interleaved), so a LoRA's update to them, B @ A, must reach llama.cpp
with B's rows permuted the same way (q over the attention heads, k over the key-value heads).
Without it the top token often survives while the logits are wrong. Qwen2, Qwen3, Gemma,
Gemma 2, Gemma 3 and Phi-3 are stored unpermuted; Phi-3's fused projections stay fused (qkv_proj is
attn_qkv, gate_up_proj is ffn_up, split by llama.cpp when it runs).

The folder appears by one rename of a finished temporary folder: an export that is killed leaves
no half-written adapter (at most a `.NAME.partial-*` folder beside it, safe to delete).
"""

from __future__ import annotations

import os
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
from transformers import PretrainedConfig

from reef.errors import Conflict, Unsupported
from reef.training.adapter import TrainedAdapter


@dataclass(frozen=True)
class GgufArchitecture:
    """How llama.cpp's converter writes one kind of Hugging Face model."""

    arch: gguf.MODEL_ARCH
    permutes_qk: bool = False  # Wq and Wk rows reordered by the converter's LlamaModel.permute

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


# Hugging Face `config.model_type` -> its GGUF architecture: those whose exported adapters
# tests/training/test_export_architectures.py loads in the installed llama.cpp.
ARCHITECTURES = {
    "llama": GgufArchitecture(gguf.MODEL_ARCH.LLAMA, permutes_qk=True),
    "mistral": GgufArchitecture(gguf.MODEL_ARCH.LLAMA, permutes_qk=True),  # converted as llama
    "qwen2": GgufArchitecture(gguf.MODEL_ARCH.QWEN2),
    "qwen3": GgufArchitecture(gguf.MODEL_ARCH.QWEN3),
    "gemma": GgufArchitecture(gguf.MODEL_ARCH.GEMMA),
    "gemma2": GgufArchitecture(gguf.MODEL_ARCH.GEMMA2),
    "gemma3_text": GgufArchitecture(gguf.MODEL_ARCH.GEMMA3),  # Gemma3ForCausalLM, text only
    "phi3": GgufArchitecture(gguf.MODEL_ARCH.PHI3),
}

# A llama block's projections as peft names them: every LoRA target a llama model exports.
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class GgufLora:
    architecture: str  # general.architecture: llama.cpp refuses an adapter for another
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


def gguf_architecture(config: PretrainedConfig) -> GgufArchitecture:
    """The GGUF architecture llama.cpp's converter gives a model, or Unsupported."""
    found = ARCHITECTURES.get(config.model_type)
    if found is None:
        raise Unsupported(
            f"GGUF LoRA export supports the model types {', '.join(ARCHITECTURES)}, "
            f"not {config.model_type!r}; the PEFT adapter alone can serve on vLLM"
        )
    return found


def gguf_lora(model: PeftModel, permute_qk: bool = True) -> GgufLora:
    """The active adapter's tensors as llama.cpp names and lays them out.

    `permute_qk=False` leaves a llama's q and k unpermuted: wrong for llama.cpp, there so a test
    can show that the permutation is needed.
    """
    config = model.config
    architecture = gguf_architecture(config)
    name = model.active_adapter
    alpha = _lora_alpha(model, name)
    names = gguf.get_tensor_name_map(architecture.arch, config.num_hidden_layers)
    tensors: dict[str, np.ndarray] = {}
    for path, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer) or not _holds(module, name):
            continue
        kind, base_name = _block_tensor(names, path)
        _refuse_variants(path, module, name)
        a, b = _weight(module.lora_A[name]), _weight(module.lora_B[name])
        # llama.cpp scales by alpha / rank; fold any other peft scaling (rslora, alpha
        # patterns) into B so the product comes out the same.
        b = b * (float(module.scaling[name]) / (alpha / a.shape[0]))
        if permute_qk and architecture.permutes_qk:
            b = _llama_cpp_row_order(b, kind, config)
        tensors[f"{base_name}.lora_a"] = np.ascontiguousarray(a, dtype=np.float32)
        tensors[f"{base_name}.lora_b"] = np.ascontiguousarray(b, dtype=np.float32)
    if not tensors:
        raise Unsupported("the model carries no LoRA weights to export")
    return GgufLora(architecture=architecture.name, alpha=alpha, tensors=tensors)


def permute_rows(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's Wq/Wk permutation (`LlamaModel.permute`), applied to rows."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf_lora(lora: GgufLora, path: Path) -> None:
    writer = gguf.GGUFWriter(str(path), lora.architecture)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora.alpha)
    for name, tensor in lora.tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _lora_alpha(model: PeftModel, name: str) -> float:
    settings = model.peft_config[name]
    if not isinstance(settings, LoraConfig):
        raise Unsupported(f"adapter {name!r} is not a LoRA: llama.cpp adapters hold LoRA only")
    return float(settings.lora_alpha)


def _holds(module: LoraLayer, name: str) -> bool:
    return name in module.lora_A or name in module.lora_embedding_A


def _block_tensor(names: gguf.TensorNameMap, path: str) -> tuple[gguf.MODEL_TENSOR, str]:
    """The kind and GGUF name (`blk.N.attn_q.weight`) of the block weight a module adapts."""
    found = names.get_type_and_name(f"{path}.weight", try_suffixes=(".weight",))
    if found is None or "{bid}" not in gguf.TENSOR_NAMES[found[0]]:
        raise Unsupported(
            f"{path}: llama.cpp adapters cover the projections inside the model's blocks only"
        )
    return found


def _refuse_variants(path: str, module: LoraLayer, name: str) -> None:
    variant = getattr(module, "lora_variant", {}).get(name)  # DoRA and kin (peft >= 0.17)
    if variant is not None or module.use_dora.get(name) or module.lora_bias.get(name):
        raise Unsupported(f"{path}: llama.cpp adapters hold plain LoRA only (no DoRA, no bias)")


def _llama_cpp_row_order(
    b: np.ndarray, kind: gguf.MODEL_TENSOR, config: PretrainedConfig
) -> np.ndarray:
    if kind == gguf.MODEL_TENSOR.ATTN_Q:
        return permute_rows(b, config.num_attention_heads)
    if kind == gguf.MODEL_TENSOR.ATTN_K:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return permute_rows(b, kv_heads)
    return b


def _weight(linear: nn.Module) -> np.ndarray:
    weight = linear.weight
    assert isinstance(weight, torch.Tensor)
    return weight.detach().float().cpu().numpy()
