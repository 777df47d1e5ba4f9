"""The pieces every LoRA trainer shares: its settings, a LoRA on a copy of the base (new or
resumed), the AdamW loop, each step's thread count, the seeded batch order and what a run
returns.

`lora.py` (supervised), `policy.py` (policy gradient) and `distributed.py` (their data-parallel
ranks) are built from them. The base is never modified: a LoRA wraps a copy of it, so one loaded
base serves many training runs (the copy costs one model's memory, 0.5 GB for SmolLM2-135M in
float32).
"""

from __future__ import annotations

import copy
import importlib.util
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from pydantic import BaseModel, ConfigDict, Field

from reef.errors import BadRequest
from reef.threads import ThreadChoice, available_cpus
from reef.training.base import Base

__all__ = [
    "LoraSettings",
    "StepThreads",
    "TrainedAdapter",
    "batches",
    "choose_backend",
    "load_lora",
    "new_lora",
    "optimise",
    "peft_folder",
    "seed_everything",
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
    # Torch threads for each step: None leaves torch as the caller set it; a count fixes it;
    # "auto" gives each step the count timed fastest lately, up to this process's CPUs
    # (`StepThreads`). A data-parallel rank keeps its share of the CPUs.
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None


# More threads must make a step this much faster to be used: on a CPU shared with the server, a
# second thread that buys the step little costs the server's decoding a tenth of its speed.
STEP_THREADS_MARGIN = 0.15
STEP = "training step"  # the one kind of call a run's ThreadChoice times


class StepThreads:
    """Torch's thread count for each step of one run, as `LoraSettings.threads` says; used as a
    context manager around the run, which puts torch's count back as it was.

    With "auto", two threads on two quiet cores make a step about 1.6x faster than one; beside a
    server that is decoding, they make it no faster and slow the server (`docs/training.md`).
    So each step is timed and `ThreadChoice` picks the count (the first step, which warms up,
    is not counted)."""

    def __init__(self, threads: int | Literal["auto"] | None, alone: bool = True) -> None:
        self._before = torch.get_num_threads()
        self._choice: ThreadChoice | None = None
        # A data-parallel rank (not alone) keeps the share it was spawned with.
        if alone and threads == "auto":
            self._choice = ThreadChoice(available_cpus(), margin=STEP_THREADS_MARGIN)
        elif alone and isinstance(threads, int):
            torch.set_num_threads(threads)
        self._count = self._before
        self._started = 0.0
        self.used: list[int] = []  # each step's thread count

    def __enter__(self) -> StepThreads:
        return self

    def __exit__(self, *_exception: object) -> None:
        torch.set_num_threads(self._before)

    def before_step(self) -> None:
        if self._choice is not None:
            self._count = self._choice.threads_for(STEP)
            torch.set_num_threads(self._count)
        else:
            self._count = torch.get_num_threads()
        self.used.append(self._count)
        self._started = time.perf_counter()

    def after_step(self) -> None:
        if self._choice is not None and len(self.used) > 1:  # the first step warms up
            self._choice.took(STEP, self._count, time.perf_counter() - self._started)


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
    found = peft_folder(folder)
    return PeftModel.from_pretrained(copy.deepcopy(base.model), found, is_trainable=True)


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
    with StepThreads(settings.threads, alone=synchronise is None) as threads:
        for step in range(1, settings.steps + 1):
            threads.before_step()
            loss = next_loss()
            loss.backward()
            if synchronise is not None:
                loss = synchronise(trainable, loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            threads.after_step()
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


def batches(count: int, size: int, seed: int) -> Iterator[list[int]]:
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


def peft_folder(folder: Path) -> Path:
    for candidate in (folder, folder / "peft"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise BadRequest(f"{folder} holds no PEFT adapter (adapter_config.json) to resume from")
