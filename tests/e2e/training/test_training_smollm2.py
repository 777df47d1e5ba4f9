"""The training backend on the real embedded SmolLM2-135M: loading, tokenizer parity with
llama.cpp, and the key check that an exported GGUF adapter changes llama.cpp's logits the way the
PEFT adapter changes torch's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from peft.tuners.lora import LoraLayer

from reef.engines.llamacpp import embedded_model_path
from reef.sdk.weights import base_cache
from reef.testing.tiny import tiny_tokenizer
from reef.training import (
    Base,
    LoraSettings,
    TokenizerMismatch,
    TrainedAdapter,
    check_tokenizer,
    encode_completion,
    export_adapter,
    load_base,
)
from reef.training import base as training_base
from reef.training.adapter import new_lora
from reef.training.export import LLAMA_PROJECTIONS, gguf_lora, write_gguf_lora
from tests.support.training import correlation, llama_cpp_last_logits, one_thread

__all__ = ["one_thread"]  # shared fixtures, used by name


TEXTS = [
    "Name three colours.",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n84<|im_end|>\n",
    "def add(a, b):\n    return a + b  # ünïcödé, 日本語, emoji 🙂",
]
PROMPT = [{"role": "user", "content": "Name three colours and say why the sky is blue."}]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    """The served model as the learning worker loads it: dequantised once per machine, into the
    cache every project shares (the first load on a machine runs transformers' GGUF reader,
    20 to 50 s; the learning loops of tests/e2e/learning load the same copy)."""
    cache = base_cache() or tmp_path_factory.mktemp("base-cache")
    return load_base(embedded_model_path(), cache)


def test_the_gguf_base_is_cached_once_and_reloads_fast(
    base: Base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache that lacks the file's copy makes it once (here by copying the machine's, which the
    real dequantising made); a second load reads it and dequantises nothing."""
    gguf_path = embedded_model_path()
    assert base.gguf == gguf_path and base.source == gguf_path
    assert (base.weights / "model.safetensors").is_file()
    assert base.model.dtype == torch.float32 and not base.model.training
    assert base.tokenizer.chat_template  # the GGUF's chat template is kept
    made: list[Path] = []

    def dequantise(gguf: Path, out: Path) -> None:
        made.append(gguf)
        shutil.copytree(base.weights, out)

    monkeypatch.setattr(training_base, "_dequantise", dequantise)
    first = load_base(gguf_path, tmp_path)
    messages: list[str] = []
    again = load_base(gguf_path, tmp_path, progress=messages.append)
    assert made == [gguf_path]
    assert first.weights == again.weights == tmp_path / base.weights.name
    assert [path.name for path in tmp_path.iterdir()] == [base.weights.name]  # no partial left
    assert not any("dequantising" in message for message in messages)
    # Another reader (transformers, or `_dequantise` revised) makes its own copy, and the
    # copy of the reader before goes.
    monkeypatch.setattr(training_base, "DEQUANTISE_REVISION", training_base.DEQUANTISE_REVISION + 1)
    revised = load_base(gguf_path, tmp_path)
    assert made == [gguf_path, gguf_path]
    assert [path.name for path in tmp_path.iterdir()] == [revised.weights.name]
    assert revised.weights.name != base.weights.name
    ids = torch.tensor([[1, 4093, 198, 26843, 665, 2]], device=base.model.device)
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=ids).logits, base.model(input_ids=ids).logits)


def test_the_trainer_tokenizes_as_llama_cpp_does(base: Base) -> None:
    check_tokenizer(base.tokenizer, embedded_model_path(), TEXTS)
    completion = encode_completion(base.tokenizer, "Red, green and blue.")
    assert completion[-1] == 2 and base.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert 1 not in completion  # no BOS (<|im_start|>)


def test_a_different_tokenizer_is_refused(base: Base) -> None:
    with pytest.raises(TokenizerMismatch) as refused:
        check_tokenizer(tiny_tokenizer(), embedded_model_path(), TEXTS)
    assert refused.value.status == 400
    assert "Name three colours." in refused.value.message and "token 0" in refused.value.message


def test_the_tokenizer_as_transformers_reads_it_from_the_gguf_is_refused() -> None:
    """Unaligned, transformers' GGUF tokenizer adds a BOS that llama.cpp does not: the reason
    load_base aligns it (and the kind of difference check_tokenizer exists to catch)."""
    from transformers import AutoTokenizer

    path = embedded_model_path()
    raw = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with pytest.raises(TokenizerMismatch, match=r"trainer \[1, "):
        check_tokenizer(raw, path, TEXTS)


@pytest.fixture(scope="module")
def random_lora(base: Base, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """A LoRA on all seven projections with seeded random, non-zero A and B, exported twice:
    as export_adapter writes it, and with q/k left unpermuted (wrong, for comparison)."""
    settings = LoraSettings(target_modules=list(LLAMA_PROJECTIONS))
    model = new_lora(base, settings)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for linear in (module.lora_A["default"], module.lora_B["default"]):
                    weight = linear.weight
                    weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)
    model.eval()
    folder = tmp_path_factory.mktemp("random-lora")
    adapter = TrainedAdapter(
        model=model, losses=[], peak_memory_bytes=0, seconds=0.0, backend="peft", settings=settings
    )
    export_adapter(adapter, folder / "lora")
    write_gguf_lora(gguf_lora(model, permute_qk=False), folder / "unpermuted.gguf")
    yield model, folder / "lora" / "adapter.gguf", folder / "unpermuted.gguf"


def test_the_gguf_adapter_changes_llama_cpp_s_logits_as_peft_changes_torch_s(
    base: Base, random_lora: tuple
) -> None:
    """Not exact, and cannot be: llama.cpp runs the Q4_1 weights with activations quantised to
    8 bits (and sums in another order), torch the dequantised weights in float32; the base
    logits of the two already differ a little (correlation ~0.999). So the test compares the
    change the adapter makes, lora minus base, over the whole vocabulary: measured 0.99 with
    the q/k permutation, 0.86 without it, while the top token was the same in all of them."""
    model, adapter, unpermuted = random_lora
    prompt = list(base.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))
    ids = torch.tensor([prompt], device=base.model.device)
    with torch.no_grad():
        torch_base = base.model(input_ids=ids).logits[0, -1].cpu().numpy()
        torch_lora = model(input_ids=ids).logits[0, -1].cpu().numpy()
    llama_base, llama_lora, llama_wrong = llama_cpp_last_logits(
        embedded_model_path(), prompt, [None, adapter, unpermuted], n_ctx=512, threads=2
    )

    assert correlation(torch_base, llama_base) > 0.99  # the same model on both sides
    torch_change = torch_lora - torch_base
    assert np.abs(torch_change).mean() > 0.5  # the adapter really moves the logits
    right = correlation(torch_change, llama_lora - llama_base)
    wrong = correlation(torch_change, llama_wrong - llama_base)
    print(f"correlation of the logit change: permuted {right:.4f}, unpermuted {wrong:.4f}")
    assert right > 0.95
    assert wrong < 0.92 and right - wrong > 0.05  # the q/k permutation is needed
