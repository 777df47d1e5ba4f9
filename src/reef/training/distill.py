"""Distillation: a LoRA student pulled toward a teacher's next-token distributions, token by token.

The self-distillation recipes (`sdft`, `sdpo`) and on-policy distillation (`opd`) share this
trainer; they differ in who the teacher is and what it reads:

- **a teacher in context**: the same model, with something the student does not see in its
  prompt (a demonstration, a correct sibling attempt, the feedback's hint). Each example holds
  two prompts, the student's and the teacher's, and one completion scored under both;
- **a separate teacher**: a frozen model of the same vocabulary (a checkpoint), reading the
  student's own prompt.

A `DistillExample` is a completion (the student's own tokens, as the engine sampled them, for
the on-policy methods), the student's prompt, the teacher's prompt, and optionally the log-probs
the engine sampled the completion with. At each completion position t the trainer has the
student's distribution s_t = π_θ(· | student prompt, y<t) and the teacher's
q_t = π_teacher(· | teacher prompt, y<t), and a per-token loss, one of (`divergence`):

    forward           KL(q_t ‖ s_t) = Σ_v q(v) (log q(v) - log s(v))         mass-covering
    reverse           KL(s_t ‖ q_t) = Σ_v s(v) (log s(v) - log q(v))         mode-seeking
    jsd               β KL(q_t ‖ m_t) + (1 - β) KL(s_t ‖ m_t),  m_t = β q_t + (1 - β) s_t
    sampled_reverse   log s(y_t) - log q(y_t) on the sampled token only (on-policy distillation)

The first three are over the whole vocabulary, or with `top_k` over the k tokens the student
finds likeliest at that position plus one bucket for the rest of the vocabulary (both
distributions gathered on the same k tokens, each tail 1 - its own top-k mass), as SDPO does.
`sampled_reverse` is the single-sample estimate of the reverse KL that on-policy distillation
uses (Thinking Machines' "On-Policy Distillation", GKD's on-policy setting): its value is the
per-token log-ratio and its gradient the score-function one, (log s - log q) ∇ log s(y_t), which
is a policy gradient with the per-token advantage log q - log s.

The teacher (`teacher`):

- `ema`: the student's own adapter, moved toward the student after every optimiser step, φ ← φ +
  rate (θ - φ) (`teacher_update_rate`). 0 freezes the weights training started from (the base
  for a fresh adapter, the serving adapter for a resumed one); 1 makes the teacher the student
  as it was one step before. With `teacher_from`, it starts from the teacher an earlier run kept
  instead (`teacher_to` keeps this run's at its end): the teacher persists across runs, as the
  papers' does across training, instead of restarting at the student. The average is over the
  LoRA factors A and B, as other trainers keep an EMA adapter: at 0 and 1 exactly the weights
  above, in between an average of the factors, not of their product B·A;
- `base`: the base model, the adapter switched off;
- `model`: a separate frozen model passed to `distill(..., teacher_model=)`.

The engine sampled the completion, not the float weights trained here (a quantised model,
top-k, min-p, and perhaps an older release), so where an example carries the served log-probs
each token's loss is weighted by the truncated importance ratio min(exp(log s(y_t) - served_t),
`tis_cap`), a constant each step (no gradient through it), computed with the student as it is
at that step. `skip_tokens` leaves the first completion tokens out of the loss.

An example's loss is the mean over its trained tokens; the batch loss is the mean over the
examples of `weight` * loss, as in `loss.py` (weight 0: an example that is in the batch with no
target, as SDPO keeps an attempt whose question nothing answered correctly). With `processes`
above 1 the same update runs data-parallel (`distributed.py`) for the `ema` and `base` teachers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from peft import PeftModel
from pydantic import BaseModel, Field

from reef.errors import BadRequest
from reef.training.adapter import (
    LoraSettings,
    OnStep,
    TrainedAdapter,
    batches,
    load_lora,
    new_lora,
    optimise,
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
    start_model,
)
from reef.training.loss import Batch, TrainingExample, fit, make_batch

__all__ = [
    "DistillExample",
    "DistillSettings",
    "distill",
    "forward_kl",
    "jsd",
    "reverse_kl",
    "sampled_reverse_kl",
    "top_k_with_tail",
]

Divergence = Literal["forward", "reverse", "jsd", "sampled_reverse"]
TeacherKind = Literal["ema", "base", "model"]
TAIL_FLOOR = -1e-7  # the top-k mass's log is kept below 0, so that the tail's log is finite


class DistillSettings(LoraSettings):
    """A LoRA run (rank, learning rate, steps…) plus what the distillation loss needs."""

    divergence: Divergence = "forward"
    jsd_beta: float = Field(0.5, gt=0.0, lt=1.0)  # the teacher's weight in the JSD's mixture
    top_k: int = Field(0, ge=0)  # 0: the whole vocabulary; else the student's top k + a tail
    teacher: TeacherKind = "ema"
    teacher_update_rate: float = Field(0.01, ge=0.0, le=1.0)  # the EMA teacher's rate
    tis_cap: float | None = Field(2.0, gt=0.0)  # None: no importance-sampling correction
    skip_tokens: int = Field(0, ge=0)  # first completion tokens left out of the loss

    @classmethod
    def shared_with(cls, settings: BaseModel, **overrides: Any) -> DistillSettings:
        """The distillation settings that a recipe's settings share by name (rank, divergence,
        teacher_update_rate…), with `overrides` on top (the recipe's own batch size and max
        length, which mean something else in a recipe's settings)."""
        own = type(settings).model_fields
        shared = {name: getattr(settings, name) for name in cls.model_fields if name in own}
        shared.pop("batch_size", None)
        shared.pop("max_length", None)
        return cls(**{**shared, **overrides})


@dataclass
class DistillExample:
    """One completion scored under two prompts: the student learns, without the teacher's
    context, to give the distributions the teacher gives with it."""

    student_prompt_ids: list[int]
    teacher_prompt_ids: list[int]
    completion_ids: list[int]
    # The log-prob of each completion token as the serving engine sampled it (a record's
    # completion_logprobs), for the importance-sampling correction; None: not known.
    behaviour_logprobs: list[float] | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.student_prompt_ids or not self.teacher_prompt_ids or not self.completion_ids:
            raise ValueError("a distillation example needs both prompts and a completion")
        served = self.behaviour_logprobs
        if served is not None and len(served) != len(self.completion_ids):
            raise ValueError(
                f"{len(served)} served log-probs for {len(self.completion_ids)} tokens"
            )


# -- the divergences, on log-probabilities over the last dimension -------------------------------


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ exp(p) (p - q) over the last dimension, from log-probabilities."""
    return (p.exp() * (p - q)).sum(dim=-1)


def forward_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student): the student covers every token the teacher gives mass to."""
    return kl(teacher, student)


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(student ‖ teacher): the student keeps to tokens the teacher finds likely."""
    return kl(student, teacher)


def jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """β KL(teacher ‖ m) + (1 - β) KL(student ‖ m), m = β teacher + (1 - β) student (GKD's
    generalised Jensen-Shannon divergence, β the teacher's weight; 0.5 is the symmetric one)."""
    mixture = torch.logsumexp(
        torch.stack([teacher + math.log(beta), student + math.log(1.0 - beta)]), dim=0
    )
    return beta * kl(teacher, mixture) + (1.0 - beta) * kl(student, mixture)


def top_k_with_tail(
    student: torch.Tensor, teacher: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both distributions on the student's k likeliest tokens plus one bucket for the rest:
    log-probabilities over k + 1 entries, each summing to 1."""
    picked = student.detach().topk(min(k, student.shape[-1]), dim=-1).indices
    return _with_tail(student.gather(-1, picked)), _with_tail(teacher.gather(-1, picked))


def _with_tail(top: torch.Tensor) -> torch.Tensor:
    mass = torch.logsumexp(top, dim=-1, keepdim=True).clamp(max=TAIL_FLOOR)
    return torch.cat([top, torch.log(-torch.expm1(mass))], dim=-1)


def sampled_reverse_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """On the sampled tokens' log-probs: value log s - log q per token, gradient
    (log s - log q) ∇ log s (the log-ratio is a constant advantage, as on-policy distillation
    uses it)."""
    ratio = (student - teacher).detach()
    return ratio * torch.exp(student - student.detach())


def token_losses(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    tokens: torch.Tensor,
    settings: DistillSettings,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each completion token's loss, and the student's log-prob of it (for the importance
    weight), both (rows, tokens), from the logits that predict those tokens."""
    student = F.log_softmax(student_logits.float(), dim=-1)
    teacher = F.log_softmax(teacher_logits.float(), dim=-1)
    sampled = student.gather(-1, tokens[..., None])[..., 0]
    if settings.divergence == "sampled_reverse":
        taught = teacher.gather(-1, tokens[..., None])[..., 0]
        return sampled_reverse_kl(sampled, taught), sampled
    if settings.top_k:
        student, teacher = top_k_with_tail(student, teacher, settings.top_k)
    if settings.divergence == "forward":
        return forward_kl(student, teacher), sampled
    if settings.divergence == "reverse":
        return reverse_kl(student, teacher), sampled
    return jsd(student, teacher, settings.jsd_beta), sampled


# -- batches: both prompts, the completion's positions in each -----------------------------------


@dataclass
class DistillBatch:
    """The student's and the teacher's sequences, and per completion token (rows, tokens): where
    each sequence's logits predict it, the token, whether it is trained, the served log-prob."""

    student: Batch
    teacher: Batch
    student_positions: torch.Tensor
    teacher_positions: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    behaviour: torch.Tensor
    served: torch.Tensor
    weights: torch.Tensor

    def to(self, device: torch.device) -> DistillBatch:
        return DistillBatch(
            student=self.student.to(device),
            teacher=self.teacher.to(device),
            student_positions=self.student_positions.to(device),
            teacher_positions=self.teacher_positions.to(device),
            tokens=self.tokens.to(device),
            mask=self.mask.to(device),
            behaviour=self.behaviour.to(device),
            served=self.served.to(device),
            weights=self.weights.to(device),
        )


def make_distill_batch(
    examples: list[DistillExample], max_length: int, pad: int, skip_tokens: int = 0
) -> DistillBatch:
    """Both sequences of each example cut as `loss.fit` cuts them (the prompt loses its oldest
    tokens; the completion is cut the same way under either prompt), right-padded."""
    students = [TrainingExample(e.student_prompt_ids, e.completion_ids) for e in examples]
    teachers = [TrainingExample(e.teacher_prompt_ids, e.completion_ids) for e in examples]
    cut = [
        (fit(s, max_length), fit(t, max_length)) for s, t in zip(students, teachers, strict=True)
    ]
    width = max(len(completion) for (_, completion), _ in cut)
    shape = (len(examples), width)
    student_positions = torch.zeros(shape, dtype=torch.long)
    teacher_positions = torch.zeros(shape, dtype=torch.long)
    tokens = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    served = torch.zeros(shape, dtype=torch.float32)
    for row, (((prompt, completion), (teacher_prompt, _)), example) in enumerate(
        zip(cut, examples, strict=True)
    ):
        count = len(completion)
        # The logits at a prompt's last token predict the first completion token.
        student_positions[row, :count] = torch.arange(count) + len(prompt) - 1
        teacher_positions[row, :count] = torch.arange(count) + len(teacher_prompt) - 1
        tokens[row, :count] = torch.tensor(completion)
        mask[row, skip_tokens:count] = 1.0
        if example.behaviour_logprobs is not None:
            behaviour[row, :count] = torch.tensor(example.behaviour_logprobs[:count])
            served[row, :count] = 1.0
    weights = torch.tensor([e.weight for e in examples], dtype=torch.float32)
    return DistillBatch(
        make_batch(students, max_length, pad),
        make_batch(teachers, max_length, pad),
        student_positions,
        teacher_positions,
        tokens,
        mask,
        behaviour,
        served,
        weights,
    )


def completion_logits(
    model: torch.nn.Module, batch: Batch, positions: torch.Tensor
) -> torch.Tensor:
    """The logits that predict each completion token, (rows, tokens, vocabulary)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    index = positions[..., None].expand(-1, -1, logits.shape[-1])
    return logits.gather(1, index)


# -- the teachers -------------------------------------------------------------------------------


class Teacher:
    """Gives the teacher's logits for a batch (no gradient, no dropout) and follows the
    student after each optimiser step (the EMA teacher; the others stay as they are)."""

    def logits(self, model: PeftModel, batch: DistillBatch) -> torch.Tensor:
        raise NotImplementedError

    def follow(self, model: PeftModel) -> None:
        """After an optimiser step."""


class EMATeacher(Teacher):
    """The student's adapter as it was when training started, moved toward the student by
    `rate` after every step. Its weights live beside the model's and are swapped in for its
    forward pass."""

    def __init__(
        self, model: PeftModel, rate: float, start: dict[str, torch.Tensor] | None = None
    ) -> None:
        self.rate = rate
        own = {name: parameter.detach().clone() for name, parameter in trainable(model).items()}
        self.weights = start if start is not None and _same_shapes(start, own) else own

    def logits(self, model: PeftModel, batch: DistillBatch) -> torch.Tensor:
        with swapped_in(model, self.weights), torch.no_grad():
            return completion_logits(model, batch.teacher, batch.teacher_positions)

    def follow(self, model: PeftModel) -> None:
        with torch.no_grad():
            for name, parameter in trainable(model).items():
                self.weights[name].lerp_(parameter.detach(), self.rate)


class BaseTeacher(Teacher):
    """The base model: the adapter switched off."""

    def logits(self, model: PeftModel, batch: DistillBatch) -> torch.Tensor:
        with evaluating(model), model.disable_adapter(), torch.no_grad():
            return completion_logits(model, batch.teacher, batch.teacher_positions)


class ModelTeacher(Teacher):
    """A separate frozen model of the same vocabulary."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()

    def logits(self, model: PeftModel, batch: DistillBatch) -> torch.Tensor:
        with torch.no_grad():
            return completion_logits(self.model, batch.teacher, batch.teacher_positions)


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode (no dropout) for the block, then back to how it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def swapped_in(model: PeftModel, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """The adapter's weights replaced by `weights` for the block (in eval mode), then restored."""
    parameters = trainable(model)
    saved = {name: p.detach().clone() for name, p in parameters.items()}
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(weights[name])
    try:
        with evaluating(model):
            yield
    finally:
        with torch.no_grad():
            for name, parameter in parameters.items():
                parameter.copy_(saved[name])


def _same_shapes(kept: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> bool:
    """Whether a kept teacher fits this adapter: the same tensors, the same shapes (a teacher
    kept for another rank or other target modules is not used)."""
    return kept.keys() == own.keys() and all(kept[n].shape == own[n].shape for n in own)


def kept_teacher(path: Path | None) -> dict[str, torch.Tensor] | None:
    """The EMA teacher an earlier run kept at `path`, or None (none kept, or unreadable)."""
    if path is None or not path.is_file():
        return None
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: the teacher starts from the student
        return None
    return loaded if isinstance(loaded, dict) else None


def make_teacher(
    model: PeftModel,
    settings: DistillSettings,
    teacher_model: torch.nn.Module | None,
    start: dict[str, torch.Tensor] | None = None,
) -> Teacher:
    if settings.teacher == "model":
        if teacher_model is None:
            raise BadRequest("teacher 'model' needs the teacher: distill(..., teacher_model=)")
        return ModelTeacher(teacher_model)
    if teacher_model is not None:
        raise BadRequest(f"a teacher_model was given but the teacher is {settings.teacher!r}")
    if settings.teacher == "base":
        return BaseTeacher()
    return EMATeacher(model, settings.teacher_update_rate, start)


# -- the loss and the trainer -------------------------------------------------------------------


def example_losses(
    model: PeftModel, teacher: Teacher, batch: DistillBatch, settings: DistillSettings
) -> torch.Tensor:
    """Each example's mean loss over its trained tokens, (rows,), gradients through the
    student only."""
    taught = teacher.logits(model, batch)
    student = completion_logits(model, batch.student, batch.student_positions)
    per_token, sampled = token_losses(student, taught, batch.tokens, settings)
    per_token = per_token * importance_weights(sampled, batch, settings.tis_cap)
    tokens = batch.mask.sum(dim=1)
    return (per_token * batch.mask).sum(dim=1) / tokens.clamp(min=1.0)


def importance_weights(
    sampled: torch.Tensor, batch: DistillBatch, cap: float | None
) -> torch.Tensor | float:
    """Per token min(exp(log s - served), cap) where the served log-prob is known, 1 elsewhere;
    a constant."""
    if cap is None:
        return 1.0
    ratios = torch.clamp(torch.exp(sampled.detach() - batch.behaviour), max=cap)
    return torch.where(batch.served > 0, ratios, torch.ones_like(ratios))


def distill_loss(
    model: PeftModel, teacher: Teacher, batch: DistillBatch, settings: DistillSettings
) -> torch.Tensor:
    """The batch loss: the mean over examples of weight * the example's loss."""
    return (example_losses(model, teacher, batch, settings) * batch.weights).mean()


def distill(
    base: Base,
    examples: list[DistillExample],
    settings: DistillSettings | None = None,
    on_step: OnStep | None = None,
    resume_from: Path | None = None,
    teacher_model: torch.nn.Module | None = None,
    teacher_from: Path | None = None,
    teacher_to: Path | None = None,
) -> TrainedAdapter:
    """`settings.steps` AdamW steps of the distillation loss on a LoRA (fresh on a copy of the
    base, or the adapter in `resume_from` trained further), `batch_size` examples a step in the
    seeded order of `train_lora`. `on_step(step, loss)` after each step, after the EMA teacher
    has followed it. The EMA teacher starts from the one kept at `teacher_from` (when it fits
    the adapter) and is kept at `teacher_to` at the end."""
    settings = settings or DistillSettings()
    if not examples:
        raise BadRequest("no distillation examples: nothing to train on")
    if settings.processes > 1:
        if teacher_model is not None or settings.teacher == "model":
            raise BadRequest("a separate teacher model distils in one process (processes 1)")
        if teacher_from is not None or teacher_to is not None:
            raise BadRequest("a kept teacher distils in one process (processes 1)")
        return in_parallel(_distill_rank, base, examples, settings, on_step, resume_from)
    seed_everything(settings.seed)
    model = load_lora(base, resume_from) if resume_from is not None else new_lora(base, settings)
    teacher = make_teacher(model, settings, teacher_model, kept_teacher(teacher_from))
    device = next(model.parameters()).device
    pad = pad_id(base)
    order = batches(len(examples), settings.batch_size, settings.seed)

    def next_loss() -> torch.Tensor:
        chosen = [examples[index] for index in next(order)]
        batch = make_distill_batch(chosen, settings.max_length, pad, settings.skip_tokens)
        return distill_loss(model, teacher, batch.to(device), settings)

    trained = optimise(model, settings, next_loss, following(teacher, model, on_step), "peft")
    if teacher_to is not None and isinstance(teacher, EMATeacher):
        teacher_to.parent.mkdir(parents=True, exist_ok=True)
        torch.save(teacher.weights, teacher_to)
    return trained


def following(teacher: Teacher, model: PeftModel, on_step: OnStep | None) -> OnStep:
    """An `on_step` that first moves the teacher after the step that was just taken."""

    def step(number: int, loss: float) -> None:
        teacher.follow(model)
        if on_step is not None:
            on_step(number, loss)

    return step


def _distill_rank(
    group: Group,
    base: Base,
    examples: list[DistillExample],
    settings: DistillSettings,
    resume_from: Path | None,
    on_step: OnStep | None,
) -> TrainedAdapter:
    """One rank's part of each step: its shard of the batch, weight * loss summed and divided by
    the whole batch's size, so the ranks' parts add up to `distill_loss`. Every rank holds the
    same adapter, so every rank's EMA teacher follows it the same way."""
    model = start_model(group, base, settings, resume_from)
    teacher = make_teacher(model, settings, None)
    parameters = list(trainable(model).values())
    pad = pad_id(base)
    order = batches(len(examples), settings.batch_size, settings.seed)

    def next_loss() -> torch.Tensor:
        chosen = next(order)
        mine = shard(chosen, group.rank, group.size)
        if not mine:  # fewer examples in the batch than ranks: this one adds nothing
            return sum((p.sum() for p in parameters), torch.zeros(())) * 0.0
        batch = make_distill_batch(
            [examples[i] for i in mine], settings.max_length, pad, settings.skip_tokens
        ).to(device_of(model))
        losses = example_losses(model, teacher, batch, settings)
        return (losses * batch.weights).sum() / len(chosen)

    step = following(teacher, model, on_step)
    trained = optimise(model, settings, next_loss, step, "peft", synchronise=group.synchronise)
    return finish_rank(group, trained)
