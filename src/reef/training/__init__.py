"""The LoRA training backend that learning recipes call (needs the `train` extra: torch, peft).

    base = load_base(model_path, cache_dir)            # float32 torch model, matching tokenizer
    check_tokenizer(base.tokenizer, gguf_path, texts)  # refuse if the engine tokenizes otherwise
    trained = train_lora(base, examples, LoraSettings(steps=40), on_step=print)
    export_adapter(trained, folder)                    # folder/peft/ and folder/adapter.gguf
    export_checkpoint(trained, base, folder)           # merged: folder/checkpoint/model.gguf
    train_policy(base, policy_examples, PolicySettings())  # PPO-style, per-token advantages

Importing `reef.training` costs nothing: each name imports its module (and torch) on first use,
so the server, which never trains, never loads torch. See docs/training.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reef.training.adapter import LoraSettings, TrainedAdapter, choose_backend
    from reef.training.base import Base, load_base
    from reef.training.checkpoint import export_checkpoint
    from reef.training.distill import DistillExample, DistillSettings
    from reef.training.export import export_adapter
    from reef.training.logprobs import completion_logprobs, truncated_ratios
    from reef.training.lora import train_lora
    from reef.training.loss import TrainingExample
    from reef.training.policy import PolicyExample, PolicySettings, train_policy
    from reef.training.tokens import TokenizerMismatch, check_tokenizer, encode_completion

# What the `train` extra installs that these modules import at their top.
TRAIN_PACKAGES = frozenset({"gguf", "peft", "safetensors", "torch", "transformers"})
TRAIN_EXTRA = "pip install 'reef[train]' (in a checkout: pip install -e '.[train]')"


class MissingTrainExtra(ImportError):
    """Training was asked for where the `train` extra is not installed."""


def import_training_module(name: str) -> ModuleType:
    """Import a module of `reef.training`; without the `train` extra, an error that says how
    to install it rather than a bare `No module named 'torch'`."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in TRAIN_PACKAGES:
            raise
        raise MissingTrainExtra(
            f"training needs the `train` extra ({missing} is not installed): {TRAIN_EXTRA}",
            name=missing,
        ) from error


_WHERE = {
    "Base": "base",
    "load_base": "base",
    "TokenizerMismatch": "tokens",
    "check_tokenizer": "tokens",
    "encode_completion": "tokens",
    "TrainingExample": "loss",
    "LoraSettings": "adapter",
    "TrainedAdapter": "adapter",
    "choose_backend": "adapter",
    "train_lora": "lora",
    "completion_logprobs": "logprobs",
    "truncated_ratios": "logprobs",
    "export_adapter": "export",
    "export_checkpoint": "checkpoint",
    "DistillExample": "distill",
    "DistillSettings": "distill",  # distill() itself: reef.training.distill.distill
    "PolicyExample": "policy",
    "PolicySettings": "policy",
    "train_policy": "policy",
}

__all__ = [
    "Base",
    "DistillExample",
    "DistillSettings",
    "LoraSettings",
    "PolicyExample",
    "PolicySettings",
    "TokenizerMismatch",
    "TrainedAdapter",
    "TrainingExample",
    "check_tokenizer",
    "choose_backend",
    "completion_logprobs",
    "encode_completion",
    "export_adapter",
    "export_checkpoint",
    "load_base",
    "train_lora",
    "train_policy",
    "truncated_ratios",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'reef.training' has no attribute {name!r}")
    return getattr(import_training_module(f"reef.training.{_WHERE[name]}"), name)
