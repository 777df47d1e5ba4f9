"""Exporting a trained adapter: the PEFT folder, the GGUF adapter's layout, and atomicity."""

from __future__ import annotations

import copy
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from reef.errors import Conflict, Unsupported
from reef.training import (
    Base,
    LoraSettings,
    TrainedAdapter,
    TrainingExample,
    encode_completion,
    export_adapter,
    train_lora,
)
from reef.training import export as export_module
from reef.training.adapter import new_lora
from reef.training.export import LLAMA_PROJECTIONS, gguf_lora, permute_rows
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name

ALL_SEVEN = list(LLAMA_PROJECTIONS)
# llama.cpp's names for a llama block's projections, written out to check gguf's name map.
LLAMA_CPP_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
SETTINGS = LoraSettings(target_modules=ALL_SEVEN, steps=8, learning_rate=1e-2, alpha=32)


@pytest.fixture(scope="module")
def trained(base: Base) -> TrainedAdapter:
    prompt = base.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True
    )
    example = TrainingExample(list(prompt), encode_completion(base.tokenizer, "Red."))
    return train_lora(base, [example], SETTINGS)


@pytest.fixture(scope="module")
def exported(trained: TrainedAdapter, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "adapter"
    export_adapter(trained, folder)
    return folder


def test_the_peft_folder_reloads_to_the_same_logits(
    base: Base, trained: TrainedAdapter, exported: Path
) -> None:
    assert sorted(p.name for p in (exported / "peft").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base.model), exported / "peft").eval()
    ids = torch.tensor([[5, 70, 80, 90, 2, 1, 100]], device=base.model.device)
    with torch.no_grad():
        expected = trained.model(input_ids=ids).logits
        got = reloaded(input_ids=ids).logits
        plain = base.model(input_ids=ids).logits
    if trained.model.dtype == torch.float32:  # peft: exact
        assert torch.allclose(got, expected, atol=1e-5)
    else:  # Unsloth trains in bfloat16 (logits ±0.05 here): the adapter's change is the same
        change = torch.stack([(got - plain).flatten(), (expected.float() - plain).flatten()])
        assert torch.corrcoef(change)[0, 1] > 0.95
    assert not torch.allclose(got, plain, atol=1e-3)  # and the adapter does something


def test_the_gguf_adapter_has_llama_cpp_names_shapes_and_alpha(
    base: Base, trained: TrainedAdapter, exported: Path
) -> None:
    reader = gguf.GGUFReader(exported / "adapter.gguf")
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["general.type"] == "adapter"
    assert fields["adapter.type"] == "lora"
    alpha = reader.fields["adapter.lora.alpha"]
    assert alpha.types == [gguf.GGUFValueType.FLOAT32] and alpha.contents() == 32.0

    config = base.model.config
    hidden, inner = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    shapes = {  # (out, in) of each projection
        "attn_q": (hidden, hidden),
        "attn_k": (kv, hidden),
        "attn_v": (kv, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (inner, hidden),
        "ffn_up": (inner, hidden),
        "ffn_down": (hidden, inner),
    }
    expected = {}
    for layer in range(config.num_hidden_layers):
        for tensor, (out, inp) in shapes.items():
            expected[f"blk.{layer}.{tensor}.weight.lora_a"] = (SETTINGS.rank, inp)
            expected[f"blk.{layer}.{tensor}.weight.lora_b"] = (out, SETTINGS.rank)
    found = {t.name: tuple(int(n) for n in t.data.shape) for t in reader.tensors}
    assert found == expected
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}


def test_gguf_tensors_are_peft_s_with_q_and_k_rows_in_llama_cpp_order(
    base: Base, trained: TrainedAdapter, exported: Path
) -> None:
    reader = gguf.GGUFReader(exported / "adapter.gguf")
    stored = {t.name: np.array(t.data) for t in reader.tensors}
    # transformers' GGUF loader undoes llama.cpp's Wq/Wk permutation with this processor; the
    # exported lora_b, put through it, must come back as peft's lora_B.
    config = base.model.config
    undo = LlamaTensorProcessor(
        config={
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
        }
    )
    checked = 0
    for path, module in trained.model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer = int(path.split(".layers.")[1].split(".")[0])
        name = f"blk.{layer}.{LLAMA_CPP_NAMES[path.rsplit('.', 1)[1]]}.weight"
        peft_a = module.lora_A["default"].weight.detach().cpu().numpy()
        peft_b = module.lora_B["default"].weight.detach().cpu().numpy()
        assert np.array_equal(stored[f"{name}.lora_a"], peft_a)
        assert np.array_equal(undo.process(stored[f"{name}.lora_b"], name).weights, peft_b)
        if "attn_q" in name or "attn_k" in name:
            assert not np.array_equal(stored[f"{name}.lora_b"], peft_b)  # really permuted
        checked += 1
    assert checked == 7 * config.num_hidden_layers


def test_permute_rows_matches_llama_cpp_s_converter_on_a_known_case() -> None:
    # Two heads of four rows: each head's first and second halves are interleaved.
    rows = np.arange(8)[:, None].astype(np.float32)
    assert permute_rows(rows, heads=2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_peft_scaling_other_than_alpha_over_rank_is_folded_into_b(base: Base) -> None:
    settings = LoraSettings(rank=4, alpha=8, target_modules=["v_proj"])
    model = new_lora(base, settings)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            torch.nn.init.normal_(module.lora_B["default"].weight)
            module.scaling["default"] = 3.0  # as rslora or an alpha pattern would set it
    lora = gguf_lora(model)
    layer = next(m for m in model.modules() if isinstance(m, LoraLayer))
    a, b = lora.tensors["blk.0.attn_v.weight.lora_a"], lora.tensors["blk.0.attn_v.weight.lora_b"]
    peft_delta = 3.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    llama_cpp_delta = (lora.alpha / a.shape[0]) * b @ a
    assert np.allclose(llama_cpp_delta, peft_delta.detach().cpu().numpy(), atol=1e-6)


def test_an_export_that_fails_leaves_nothing_behind(
    trained: TrainedAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dies(*_args: object) -> None:
        raise MemoryError("killed while writing the GGUF")

    monkeypatch.setattr(export_module, "write_gguf_lora", dies)
    with pytest.raises(MemoryError):
        export_adapter(trained, tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []  # no adapter, no half-written temporary folder


def test_export_refuses_a_folder_that_holds_something(
    trained: TrainedAdapter, tmp_path: Path
) -> None:
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "old.txt").write_text("keep me")
    with pytest.raises(Conflict):
        export_adapter(trained, tmp_path / "adapter")
    assert [p.name for p in (tmp_path / "adapter").iterdir()] == ["old.txt"]
    # An empty folder (made ahead by a caller) is fine: the export takes its place.
    (tmp_path / "empty").mkdir()
    export_adapter(trained, tmp_path / "empty")
    assert (tmp_path / "empty" / "adapter.gguf").is_file()


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_an_adapter_llama_cpp_cannot_hold_is_refused_before_writing(
    base: Base, tmp_path: Path
) -> None:
    model = new_lora(base, LoraSettings(target_modules=["q_proj", "lm_head"]))
    adapter = TrainedAdapter(
        model=model, losses=[], peak_memory_bytes=0, seconds=0.0, backend="peft", settings=SETTINGS
    )
    with pytest.raises(Unsupported, match="lm_head"):
        export_adapter(adapter, tmp_path / "adapter")
    dora = get_peft_model(
        copy.deepcopy(base.model), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    )
    adapter.model = dora
    with pytest.raises(Unsupported, match="no DoRA"):
        export_adapter(adapter, tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []
