"""A trained LoRA merged into full weights (`reef.training.checkpoint`): llama.cpp serves the merged
GGUF as it serves the base with the adapter, for a tiny F32 llama and for the real SmolLM2 Q4_1."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from reef.engines.llamacpp import embedded_model_path
from reef.errors import Conflict
from reef.testing.tiny import tiny_tokenizer
from reef.training import Base, TrainedAdapter
from reef.training.checkpoint import CHECKPOINT_GGUF, export_checkpoint, merge_into_gguf
from reef.training.export import GgufLora, gguf_lora, write_gguf_lora
from tests.support.training import (
    base,
    correlation,
    llama_cpp_last_logits,
    one_thread,
)
from tests.training.test_export_architectures import (
    LLAMA_PROJECTIONS,
    PROMPT,
    random_lora,
    tiny_model,
    write_base_gguf,
)

__all__ = ["base", "one_thread"]  # shared fixtures, used by name


def test_a_merged_tiny_llama_gives_llama_cpp_the_logits_of_base_and_adapter(
    tmp_path: Path,
) -> None:
    model = tiny_model("llama")
    base_gguf = write_base_gguf(model, tiny_tokenizer(), tmp_path / "base.gguf")
    lora = gguf_lora(random_lora(model, LLAMA_PROJECTIONS))
    write_gguf_lora(lora, tmp_path / "adapter.gguf")
    merge_into_gguf(base_gguf, lora, tmp_path / "merged.gguf")

    plain, adapted = llama_cpp_last_logits(base_gguf, PROMPT, [None, tmp_path / "adapter.gguf"])
    (merged,) = llama_cpp_last_logits(tmp_path / "merged.gguf", PROMPT, [None])
    assert np.abs(adapted - plain).mean() > 0.1  # the adapter really moves the logits
    np.testing.assert_allclose(merged, adapted, atol=1e-3)


@pytest.mark.e2e
def test_merging_into_the_real_q4_model_keeps_every_other_tensor_and_the_chat_template(
    tmp_path: Path,
) -> None:
    base = embedded_model_path()
    lora = _random_smollm2_lora(layers=(0, 29))
    write_gguf_lora(lora, tmp_path / "adapter.gguf")
    merge_into_gguf(base, lora, tmp_path / "merged.gguf")

    before, after = gguf.GGUFReader(base), gguf.GGUFReader(tmp_path / "merged.gguf")
    template = "tokenizer.chat_template"
    assert after.fields[template].contents() == before.fields[template].contents()
    changed = {f"blk.{n}.attn_{p}.weight" for n in (0, 29) for p in ("q", "v")}
    for old, new in zip(before.tensors, after.tensors, strict=True):
        assert old.name == new.name
        if old.name in changed:
            assert new.tensor_type == gguf.GGMLQuantizationType.F16  # 4 bits would lose it
        else:
            assert new.tensor_type == old.tensor_type
            assert np.array_equal(np.asarray(old.data), np.asarray(new.data))

    # The same tensors merged with a zero update: the base's weights in F16, which llama.cpp
    # multiplies without quantising activations to 8 bits as it does for Q4_1 weights.
    zero = GgufLora("llama", lora.alpha, {name: 0 * t for name, t in lora.tensors.items()})
    merge_into_gguf(base, zero, tmp_path / "restored.gguf")
    prompt = [1, 504, 3458, 282, 4537, 314, 2]
    plain, adapted = llama_cpp_last_logits(base, prompt, [None, tmp_path / "adapter.gguf"])
    (merged,) = llama_cpp_last_logits(tmp_path / "merged.gguf", prompt, [None])
    (restored,) = llama_cpp_last_logits(tmp_path / "restored.gguf", prompt, [None])
    format_noise = np.abs(restored - plain).mean()
    moved = np.abs(adapted - plain).mean()
    assert moved > 5 * format_noise  # the adapter really moves them
    # Within a fraction of the adapter's own effect: how far F16 weights land from llama.cpp's
    # Q4 kernels with the adapter beside them depends on the CPU's kernels (under 1.5x the format's
    # noise on one machine, 2.4x on another), the adapter's effect does not (0.22 of it there).
    assert np.abs(merged - adapted).mean() < 0.5 * moved
    assert correlation(merged, adapted) > 0.995


def test_an_adapter_for_a_tensor_the_model_lacks_is_refused(tmp_path: Path) -> None:
    lora = _random_smollm2_lora(layers=(30,))  # SmolLM2-135M has 30 blocks, 0 to 29
    with pytest.raises(Conflict, match=r"blk\.30\.attn_q\.weight"):
        merge_into_gguf(embedded_model_path(), lora, tmp_path / "merged.gguf")
    assert not (tmp_path / "merged.gguf").exists()


def test_a_hugging_face_base_exports_a_merged_model_folder(base: Base, tmp_path: Path) -> None:
    trained = TrainedAdapter(
        model=random_lora(_copy(base).model, ("q_proj", "v_proj")),
        losses=[1.0],
        peak_memory_bytes=0,
        seconds=0.0,
        backend="peft",
        settings=None,  # type: ignore[arg-type]  # not read by the export
    )
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = trained.model(input_ids=ids).logits[0, -1]
    export_checkpoint(trained, base, tmp_path / "release")

    from transformers import AutoModelForCausalLM

    folder = tmp_path / "release" / "checkpoint"
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = merged(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert not (tmp_path / "release" / CHECKPOINT_GGUF).exists()


def _random_smollm2_lora(layers: tuple[int, ...], rank: int = 4) -> GgufLora:
    """Random q and v updates on `layers` of SmolLM2-135M (576 wide, 192 for 3 kv heads)."""
    generator = np.random.default_rng(0)
    tensors = {}
    for layer in layers:
        for name, rows in (
            (f"blk.{layer}.attn_q.weight", 576),
            (f"blk.{layer}.attn_v.weight", 192),
        ):
            tensors[f"{name}.lora_a"] = generator.normal(0, 0.05, (rank, 576)).astype(np.float32)
            tensors[f"{name}.lora_b"] = generator.normal(0, 0.05, (rows, rank)).astype(np.float32)
    return GgufLora(architecture="llama", alpha=8.0, tensors=tensors)


def _copy(base: Base) -> Base:
    import copy

    return Base(
        model=copy.deepcopy(base.model),
        tokenizer=base.tokenizer,
        source=base.source,
        weights=base.weights,
        gguf=None,
    )
