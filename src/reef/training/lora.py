"""Train a LoRA adapter on a base model: peft on a CPU, Unsloth on CUDA when it is installed.

The loop is plain: fixed seeds, AdamW on the adapter's parameters only, one batch per step
(examples shuffled per epoch by the seed), the loss of `loss.py` (the shared pieces are in
`adapter.py`). With `settings.processes` above 1 the same update runs data-parallel
(`distributed.py`), each rank on its shard of every batch (`_train_lora_rank`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from reef.errors import BadRequest
from reef.training.adapter import (
    LoraSettings,
    OnStep,
    TrainedAdapter,
    batches,
    choose_backend,
    load_lora,
    new_lora,
    optimise,
    peft_folder,
    seed_everything,
)
from reef.training.base import Base
from reef.training.distributed import (
    Group,
    device_of,
    finish_rank,
    in_parallel,
    pad_id,
    shard,
    shard_loss,
    start_model,
)
from reef.training.loss import TrainingExample, batch_loss, make_batch

__all__ = ["LoraSettings", "TrainedAdapter", "TrainingExample", "train_lora"]


def train_lora(
    base: Base,
    examples: list[TrainingExample],
    settings: LoraSettings | None = None,
    on_step: OnStep | None = None,
    resume_from: Path | None = None,
) -> TrainedAdapter:
    """Train a LoRA on `examples` (or keep training the adapter in `resume_from`).

    `on_step(step, loss)` is called after each step, steps counted from 1.
    """
    settings = settings or LoraSettings()
    if not examples:
        raise BadRequest("no training examples: nothing to train on")
    if settings.processes > 1:
        return in_parallel(_train_lora_rank, base, examples, settings, on_step, resume_from)
    backend = choose_backend()
    seed_everything(settings.seed)
    if backend == "unsloth":
        model = _unsloth_lora(base, settings, resume_from)
    elif resume_from is not None:
        model = load_lora(base, resume_from)
    else:
        model = new_lora(base, settings)
    device = next(model.parameters()).device
    pad = pad_id(base)
    order = batches(len(examples), settings.batch_size, settings.seed)

    def next_loss() -> torch.Tensor:
        chosen = [examples[index] for index in next(order)]
        return batch_loss(model, make_batch(chosen, settings.max_length, pad).to(device))

    return optimise(model, settings, next_loss, on_step, backend)


def _train_lora_rank(
    group: Group,
    base: Base,
    examples: list[TrainingExample],
    settings: LoraSettings,
    resume_from: Path | None,
    on_step: OnStep | None,
) -> TrainedAdapter:
    model = start_model(group, base, settings, resume_from)
    trainable = [p for p in model.parameters() if p.requires_grad]
    pad = pad_id(base)
    order = batches(len(examples), settings.batch_size, settings.seed)

    def next_loss() -> torch.Tensor:
        chosen = next(order)
        mine = shard(chosen, group.rank, group.size)
        if not mine:  # fewer examples in the batch than ranks: this one adds nothing
            return sum((p.sum() for p in trainable), torch.zeros(())) * 0.0
        batch = make_batch([examples[i] for i in mine], settings.max_length, pad)
        return shard_loss(model, batch.to(device_of(model)), len(chosen))

    trained = optimise(model, settings, next_loss, on_step, "peft", synchronise=group.synchronise)
    return finish_rank(group, trained)


def _unsloth_lora(base: Base, settings: LoraSettings, resume_from: Path | None) -> Any:
    """The same LoRA through Unsloth's fused kernels, on CUDA (not run on CPU-only machines).

    Unsloth loads the base from its Hugging Face folder (the dequantised cache for a GGUF).
    """
    os.environ.setdefault("UNSLOTH_RETURN_LOGITS", "1")  # the loss here needs the logits
    from unsloth import FastLanguageModel

    model, _tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(base.weights),
        max_seq_length=settings.max_length,
        dtype=None,
        load_in_4bit=False,
    )
    if resume_from is not None:
        return PeftModel.from_pretrained(model, peft_folder(resume_from), is_trainable=True)
    return FastLanguageModel.get_peft_model(
        model,
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        use_gradient_checkpointing="unsloth",
        random_state=settings.seed,
    )
