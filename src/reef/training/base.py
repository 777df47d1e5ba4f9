"""The served model's weights as a float32 torch model, with the tokenizer that matches the engine.

A Hugging Face folder loads directly. A GGUF file (the embedded default) goes through transformers'
GGUF loader, which dequantises every tensor and parses the vocabulary: about 25 s for SmolLM2-135M.
That happens once per file and reader: the result is saved under `cache_dir/<first 16 hex of the
file's sha256>-<DEQUANTISED_BY>/` as an ordinary Hugging Face folder (safetensors), which later
loads in under a second. Another transformers, or another `_dequantise`, makes its own copy: a
copy an older reader made is never loaded as this one's.
The cache folder appears by one rename, so a killed first load leaves no half-written cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from reef.errors import BadRequest
from reef.training.tokens import align_tokenizer, check_tokenizer

Progress = Callable[[str], None]

# Texts every GGUF-loaded tokenizer must split exactly as llama.cpp does before it is used.
SELF_CHECK = [
    "Hello, world!",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Numbers 1234567 and 3.14159; code: def f(x): return x**2",
    "Ünïcödé — “quotes” 日本語 🙂",
]


@dataclass
class Base:
    """The base model for training: never modified in place (training wraps a copy)."""

    model: PreTrainedModel  # float32, eval mode, on the GPU where CUDA is there
    tokenizer: PreTrainedTokenizerBase
    source: Path  # what was asked for: the GGUF file or the Hugging Face folder
    weights: Path  # the Hugging Face folder the weights came from (the cache, for a GGUF)
    gguf: Path | None  # the GGUF file the engine serves, when the source is one


def load_base(model_path: Path, cache_dir: Path, progress: Progress | None = None) -> Base:
    """Load `model_path` (a .gguf file or a Hugging Face folder) for training."""
    say = progress or (lambda _message: None)
    model_path = Path(model_path)
    if model_path.is_file() and model_path.suffix == ".gguf":
        folder = _cached_folder(model_path, Path(cache_dir), say)
        base = _load_folder(folder, source=model_path, gguf=model_path, say=say)
        check_tokenizer(base.tokenizer, model_path, [*SELF_CHECK, _chat_sample(base.tokenizer)])
        return base
    if (model_path / "config.json").is_file():
        return _load_folder(model_path, source=model_path, gguf=None, say=say)
    raise BadRequest(
        f"cannot train on {model_path}: expected a .gguf file or a Hugging Face model folder "
        "(one with config.json)"
    )


# Bump when `_dequantise` writes something else: copies made before are then made again.
DEQUANTISE_REVISION = 1


def dequantised_by() -> str:
    """What made a cached copy: the transformers that read the GGUF and `_dequantise`'s revision."""
    import transformers

    return f"transformers{transformers.__version__}-r{DEQUANTISE_REVISION}"


def gguf_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256: the name of its cache folder."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _cached_folder(gguf: Path, cache_dir: Path, say: Progress) -> Path:
    say(f"hashing {gguf.name}")
    digest = gguf_digest(gguf)
    folder = cache_dir / f"{digest}-{dequantised_by()}"
    if (folder / "config.json").is_file():
        return folder
    for older in cache_dir.glob(f"{digest}*"):  # the same file's copies by other readers
        shutil.rmtree(older, ignore_errors=True)
    say(f"dequantising {gguf.name} (about 25 s, once: cached in {folder})")
    partial = cache_dir / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        _dequantise(gguf, partial)
        try:
            os.rename(partial, folder)
        except OSError:  # another process cached it first: theirs is as good as ours
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _dequantise(gguf: Path, out: Path) -> None:
    """Read the GGUF with transformers, then save it as a plain float32 Hugging Face folder."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    align_tokenizer(tokenizer, gguf)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained while it still looks quantised.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "reef_source.json").write_text(
        json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}, indent=2) + "\n"
    )


def _load_folder(folder: Path, source: Path, gguf: Path | None, say: Progress) -> Base:
    say(f"loading {folder}")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.to(training_device())  # type: ignore[arg-type]  # transformers types .to oddly
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.eval()
    return Base(model=model, tokenizer=tokenizer, source=source, weights=folder, gguf=gguf)


def training_device() -> torch.device:
    """The GPU where CUDA is there (training and log-probs run on it), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _chat_sample(tokenizer: PreTrainedTokenizerBase) -> str:
    """A prompt rendered by the model's chat template: the text the engine tokenizes most."""
    if not tokenizer.chat_template:
        return "no chat template"
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": "Red, green and blue."},
        {"role": "user", "content": "And two more?"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return str(rendered)
