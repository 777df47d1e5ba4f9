"""Train a LoRA adapter on a base model: peft on a CPU, Unsloth on CUDA when it is installed.

The loop is plain: fixed seeds, AdamW on the adapter's parameters only, one batch per step
(examples shuffled per epoch by the seed), the loss of `loss.py`. The base is never modified:
training wraps a copy of it, so one loaded base serves many training runs (the copy costs one
model's memory, 0.5 GB for SmolLM2-135M in float32).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from pydantic import BaseModel, ConfigDict, Field

from reef.errors import BadRequest
from reef.training.base import Base
from reef.training.loss import TrainingExample, batch_loss, make_batch

__all__ = [
    "LoraSettings",
    "TrainedAdapter",
    "TrainingExample",
    "choose_backend",
    "load_lora",
    "new_lora",
    "optimise",
    "train_lora",
]

Backend = Literal["peft", "unsloth"]
OnStep = Callable[[int, float], None]
Synchronise = Callable[[list[torch.nn.Parameter], torch.Tensor], torch.Tensor]


class LoraSettings(BaseModel):
    """What a recipe sets for one LoRA training run."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)  # the update is scaled by alpha / rank
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    learning_rate: float = Field(5e-4, gt=0)
    steps: int = Field(40, ge=1)
    batch_size: int = Field(4, ge=1)
    max_length: int = Field(512, ge=2)  # tokens per example, prompt cut from the left
    seed: int = 0
    weight_decay: float = Field(0.0, ge=0.0)
    # Processes to train on, data-parallel on the CPU with gloo (`distributed.py`): the same
    # update as one process. 1: this process alone (on the GPU, through Unsloth where installed).
    processes: int = Field(1, ge=1)


@dataclass
class TrainedAdapter:
    model: PeftModel  # the base copy with the trained adapter, in eval mode
    losses: list[float]  # the batch loss at each step, before that step's update
    peak_memory_bytes: int  # the process's peak resident memory (getrusage maxrss)
    seconds: float  # wall time of the training steps (not of loading)
    backend: Backend
    settings: LoraSettings
    peak_gpu_bytes: int | None = None  # torch.cuda.max_memory_allocated, on CUDA


def choose_backend() -> Backend:
    """Unsloth where CUDA and the package are both there; peft otherwise.

    Unsloth cannot even be imported without CUDA, so it is looked up, not imported, here.
    """
    if torch.cuda.is_available() and importlib.util.find_spec("unsloth") is not None:
        return "unsloth"
    return "peft"


def new_lora(base: Base, settings: LoraSettings) -> PeftModel:
    """A fresh, trainable LoRA (B = 0: it starts as the base) on a copy of the base model."""
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(copy.deepcopy(base.model), config)


def load_lora(base: Base, folder: Path) -> PeftModel:
    """A saved PEFT adapter, trainable, on a copy of the base model.

    `folder` is the PEFT folder (adapter_config.json) or an exported adapter holding `peft/`.
    The adapter keeps its own rank, alpha and target modules.
    """
    found = _peft_folder(folder)
    return PeftModel.from_pretrained(copy.deepcopy(base.model), found, is_trainable=True)


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
        from reef.training.distributed import train_lora_parallel

        return train_lora_parallel(base, examples, settings, on_step, resume_from)
    backend = choose_backend()
    seed_everything(settings.seed)
    if backend == "unsloth":
        model = _unsloth_lora(base, settings, resume_from)
    elif resume_from is not None:
        model = load_lora(base, resume_from)
    else:
        model = new_lora(base, settings)
    device = next(model.parameters()).device
    pad_id = base.tokenizer.pad_token_id if base.tokenizer.pad_token_id is not None else 0
    batches = _batches(len(examples), settings.batch_size, settings.seed)

    def next_loss() -> torch.Tensor:
        chosen = [examples[index] for index in next(batches)]
        return batch_loss(model, make_batch(chosen, settings.max_length, pad_id).to(device))

    return optimise(model, settings, next_loss, on_step, backend)


def optimise(
    model: PeftModel,
    settings: LoraSettings,
    next_loss: Callable[[], torch.Tensor],
    on_step: OnStep | None,
    backend: Backend,
    synchronise: Synchronise | None = None,
) -> TrainedAdapter:
    """`settings.steps` AdamW steps on the adapter's parameters, each on a loss from
    `next_loss()`; the model ends in eval mode. `on_step(step, loss)` gets each loss, before its
    update. With several ranks, `synchronise(parameters, loss)` runs after each backward: it
    combines the ranks' gradients in place and returns the whole batch's loss."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    losses: list[float] = []
    model.train()
    started = time.perf_counter()
    for step in range(1, settings.steps + 1):
        loss = next_loss()
        loss.backward()
        if synchronise is not None:
            loss = synchronise(trainable, loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    seconds = time.perf_counter() - started
    model.eval()
    return TrainedAdapter(
        model=model,
        losses=losses,
        peak_memory_bytes=peak_rss_bytes(),
        seconds=seconds,
        backend=backend,
        settings=settings,
        peak_gpu_bytes=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS bytes, Linux KiB


def _batches(count: int, size: int, seed: int) -> Iterator[list[int]]:
    """Example indices, `size` at a time (all of them when there are fewer), shuffled per epoch."""
    size = min(size, count)
    rng = random.Random(seed)
    pending: list[int] = []
    while True:
        while len(pending) < size:
            epoch = list(range(count))
            rng.shuffle(epoch)
            pending.extend(epoch)
        yield pending[:size]
        del pending[:size]


def _peft_folder(folder: Path) -> Path:
    for candidate in (folder, folder / "peft"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise BadRequest(f"{folder} holds no PEFT adapter (adapter_config.json) to resume from")


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
        return PeftModel.from_pretrained(model, _peft_folder(resume_from), is_trainable=True)
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
