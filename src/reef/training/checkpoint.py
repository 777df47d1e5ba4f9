"""A trained LoRA merged into full weights: a `checkpoint` release's folder.

    folder/checkpoint/model.gguf          the base GGUF with the adapter merged in (llama.cpp)
    folder/checkpoint/config.json, ...    a Hugging Face model folder, for a base that is one (vLLM)

For a GGUF base the merge happens in llama.cpp's own layout: the adapter is first converted as for
an adapter release (`reef.training.export.gguf_lora`: llama.cpp's names, Wq and Wk rows permuted),
then each tensor it changes becomes `dequantised base + alpha / rank * B @ A`, stored in F16 (F32
where the base has F32): a 4-bit block would round the update away. Every other tensor and every
metadata key (vocabulary, chat template) is copied byte for byte, so the result serves exactly as
the base does with the adapter applied, within F16 rounding, and llama.cpp loads it as a model.

The folder appears by one rename of a finished temporary folder, as an adapter export does.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import numpy as np

from reef.artifacts import CHECKPOINT_FOLDER
from reef.errors import Conflict

if TYPE_CHECKING:  # torch and peft: the GGUF merge itself needs neither
    from reef.training.adapter import TrainedAdapter
    from reef.training.base import Base
    from reef.training.export import GgufLora

CHECKPOINT_GGUF = f"{CHECKPOINT_FOLDER}/model.gguf"
# Header fields the writer makes itself.
_WRITER_FIELDS = ("GGUF.", "general.architecture")


def export_checkpoint(trained: TrainedAdapter, base: Base, folder: Path) -> None:
    """Write `folder/checkpoint/`: the base with `trained`'s adapter merged in, as a GGUF when
    the base is one (what llama.cpp serves), else as a Hugging Face folder."""
    from reef.training.export import gguf_lora

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise Conflict(f"{folder} already exists and is not empty: export into a new folder")
    lora = gguf_lora(trained.model) if base.gguf is not None else None  # it may refuse
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        (partial / CHECKPOINT_FOLDER).mkdir(parents=True)
        if base.gguf is not None and lora is not None:
            merge_into_gguf(base.gguf, lora, partial / CHECKPOINT_GGUF)
        else:
            merged = trained.model.merge_and_unload()  # the trained copy, never the base
            merged.save_pretrained(str(partial / CHECKPOINT_FOLDER))
            base.tokenizer.save_pretrained(str(partial / CHECKPOINT_FOLDER))
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def merge_into_gguf(base: Path, lora: GgufLora, out: Path) -> None:
    """`base` with `lora` merged into the tensors it adapts, written to `out`."""
    reader = gguf.GGUFReader(base)
    architecture = reader.fields["general.architecture"].contents()
    if architecture != lora.architecture:
        raise Conflict(
            f"the adapter is for {lora.architecture} and {base.name} is {architecture}: "
            "merge an adapter into the model it was trained on"
        )
    updates = _updates(lora)
    missing = sorted(set(updates) - {tensor.name for tensor in reader.tensors})
    if missing:
        raise Conflict(f"{base.name} has no tensor {missing[0]} that the adapter changes")
    writer = gguf.GGUFWriter(str(out), architecture)
    _copy_metadata(reader, writer)
    for tensor in reader.tensors:
        if tensor.name in updates:
            writer.add_tensor(tensor.name, _merged(tensor, updates[tensor.name]))
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _updates(lora: GgufLora) -> dict[str, np.ndarray]:
    """Tensor name -> the weight update its lora_a and lora_b make, as llama.cpp applies it."""
    updates = {}
    for name, a in lora.tensors.items():
        if not name.endswith(".lora_a"):
            continue
        target = name.removesuffix(".lora_a")
        b = lora.tensors[f"{target}.lora_b"]
        updates[target] = (lora.alpha / a.shape[0]) * (b @ a)
    return updates


def _merged(tensor: gguf.ReaderTensor, update: np.ndarray) -> np.ndarray:
    weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(update.shape)
    merged = weights.astype(np.float32) + update
    keep_f32 = tensor.tensor_type == gguf.GGMLQuantizationType.F32
    return merged if keep_f32 else merged.astype(np.float16)


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        if field.name.startswith(_WRITER_FIELDS):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type)
