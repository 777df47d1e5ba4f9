"""Policy-gradient LoRA updates: a PPO-style clipped loss on per-token advantages, with a KL
penalty that keeps the policy near the base model.

Each example is a completion the policy sampled, with an advantage for each of its tokens (a
sequence-level advantage is the same number on every token). At the start of an update the
trainer computes, once and without gradients:

- the **old** log-probs: the policy as it was when the update began (the adapter being trained,
  resumed from the current release), so the first gradient step is exactly on-policy;
- the **base** log-probs: the same tokens with the adapter switched off.

Then for `steps` gradient steps, on each token t with ratio r = exp(new - old) and advantage A:

    loss_t = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_beta * k3(base, new)
    k3(base, new) = exp(base - new) - (base - new) - 1        (>= 0, an unbiased KL estimator)

The answers were sampled by the serving engine (a quantised model, top-k and min-p), not by the
float weights trained here, so `old` is not the behaviour policy and the ratio above never sees
the mismatch. Where an example carries the log-probs the engine served (`behaviour_logprobs`), the
policy term of each token is weighted by the truncated importance-sampling ratio

    w_t = min(exp(old_t - behaviour_t), tis_cap)            (a constant: no gradient through it)

as RL trainers that sample with one engine and train with another do (truncated importance
sampling, `tis_cap` 2 by default; None turns it off). Tokens without served log-probs weigh 1.

An example's loss is the mean over its completion tokens; the batch loss is the mean over
examples. The asymmetric clip (0.2 low, 0.28 high) lets a token's probability rise further than
it may fall in one update, as DAPO does. Tokens whose advantage is masked out (`mask` 0, e.g. a
session's last turn) contribute nothing, not even to the KL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import PeftModel
from pydantic import Field

from reef.errors import BadRequest
from reef.training.adapter import (
    LoraSettings,
    TrainedAdapter,
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

OnStep = Callable[[int, float], None]


class PolicySettings(LoraSettings):
    """A LoRA run (rank, learning rate, steps…) plus the policy loss's own knobs."""

    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.28, ge=0.0)
    kl_beta: float = Field(0.02, ge=0.0)
    steps: int = Field(4, ge=1)  # gradient steps on the batch (PPO epochs over it)
    # The cap of the truncated importance-sampling weight on served log-probs (None: off).
    tis_cap: float | None = Field(2.0, gt=0.0)


@dataclass
class PolicyExample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantages: list[float]  # one per completion token
    mask: list[float] | None = None  # 1 where a token is trained, 0 where it is masked out
    # The log-prob of each completion token as the serving engine sampled it (the record's
    # completion_logprobs), for the importance-sampling correction; None: not known.
    behaviour_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.completion_ids:
            raise ValueError("a policy example needs at least one prompt and one completion id")
        if len(self.advantages) != len(self.completion_ids):
            raise ValueError(
                f"{len(self.advantages)} advantages for {len(self.completion_ids)} tokens"
            )
        if self.mask is not None and len(self.mask) != len(self.completion_ids):
            raise ValueError(f"{len(self.mask)} mask values for {len(self.completion_ids)} tokens")
        served = self.behaviour_logprobs
        if served is not None and len(served) != len(self.completion_ids):
            tokens = len(self.completion_ids)
            raise ValueError(f"{len(served)} served log-probs for {tokens} tokens")

    @classmethod
    def sequence(
        cls, prompt_ids: list[int], completion_ids: list[int], advantage: float
    ) -> PolicyExample:
        """Every token of the completion gets the same advantage."""
        return cls(prompt_ids, completion_ids, [advantage] * len(completion_ids))


@dataclass
class PolicyBatch:
    """A padded batch plus per-position tensors in the shifted frame: column t is the token at
    t + 1, predicted by the logits at t."""

    batch: Batch
    advantages: torch.Tensor  # (examples, length - 1)
    mask: torch.Tensor  # (examples, length - 1): 1 on trained completion tokens
    # The served log-probs where known, and 1 where they are (else 0).
    behaviour: torch.Tensor | None = None
    served: torch.Tensor | None = None

    def to(self, device: torch.device) -> PolicyBatch:
        moved = [t.to(device) if t is not None else None for t in (self.behaviour, self.served)]
        return PolicyBatch(
            self.batch.to(device), self.advantages.to(device), self.mask.to(device), *moved
        )


def make_policy_batch(examples: list[PolicyExample], max_length: int, pad_id: int) -> PolicyBatch:
    """Examples cut as `loss.fit` cuts them (the prompt loses its oldest tokens first), padded."""
    plain = [TrainingExample(e.prompt_ids, e.completion_ids) for e in examples]
    batch = make_batch(plain, max_length, pad_id)
    width = batch.input_ids.shape[1] - 1
    advantages = torch.zeros((len(examples), width), dtype=torch.float32)
    mask = torch.zeros((len(examples), width), dtype=torch.float32)
    behaviour = torch.zeros((len(examples), width), dtype=torch.float32)
    served = torch.zeros((len(examples), width), dtype=torch.float32)
    for row, (example, cut) in enumerate(zip(examples, plain, strict=True)):
        prompt, completion = fit(cut, max_length)
        start = len(prompt) - 1  # the logits at the prompt's last token predict the first one
        end = start + len(completion)
        advantages[row, start:end] = torch.tensor(example.advantages[: len(completion)])
        kept = example.mask[: len(completion)] if example.mask is not None else None
        mask[row, start:end] = torch.tensor(kept) if kept is not None else 1.0
        if example.behaviour_logprobs is not None:
            behaviour[row, start:end] = torch.tensor(example.behaviour_logprobs[: len(completion)])
            served[row, start:end] = 1.0
    return PolicyBatch(batch, advantages, mask, behaviour, served)


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log p(token t + 1 | tokens ≤ t) at every position, shape (examples, length - 1)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    predicted = F.log_softmax(logits[:, :-1, :].float(), dim=-1)
    return predicted.gather(-1, batch.input_ids[:, 1:, None])[..., 0]


def clipped_objective(
    new: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> torch.Tensor:
    """Per token -min(r A, clip(r, 1 - low, 1 + high) A), r = exp(new - old): the PPO loss."""
    ratio = torch.exp(new - old)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def k3_kl(new: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Per token exp(base - new) - (base - new) - 1: an estimate of KL(policy ‖ base), ≥ 0."""
    difference = base - new
    return torch.exp(difference) - difference - 1.0


def importance_weights(
    old: torch.Tensor, batch: PolicyBatch, cap: float | None
) -> torch.Tensor | float:
    """Per token min(exp(old - served), cap) where the served log-prob is known, 1 elsewhere;
    1 everywhere without a cap."""
    if cap is None or batch.behaviour is None or batch.served is None:
        return 1.0
    weights = torch.clamp(torch.exp(old - batch.behaviour), max=cap)
    return torch.where(batch.served > 0, weights, torch.ones_like(weights)).detach()


def policy_loss(
    new: torch.Tensor,
    old: torch.Tensor,
    base: torch.Tensor,
    batch: PolicyBatch,
    settings: PolicySettings,
) -> torch.Tensor:
    """The batch loss: each example's mean over its trained tokens, then the mean over examples."""
    per_example, trained = example_policy_losses(new, old, base, batch, settings)
    return (per_example * trained).sum() / trained.sum().clamp(min=1.0)


def example_policy_losses(
    new: torch.Tensor,
    old: torch.Tensor,
    base: torch.Tensor,
    batch: PolicyBatch,
    settings: PolicySettings,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's mean loss over its trained tokens, and 1 for each example that has any
    (0 for one masked out entirely), both shape (examples,)."""
    weights = importance_weights(old, batch, settings.tis_cap)
    per_token = weights * clipped_objective(
        new, old, batch.advantages, settings.clip_low, settings.clip_high
    ) + settings.kl_beta * k3_kl(new, base)
    tokens = batch.mask.sum(dim=1)
    per_example = (per_token * batch.mask).sum(dim=1) / tokens.clamp(min=1.0)
    trained = (tokens > 0).float()
    return per_example, trained


def train_policy(
    base: Base,
    examples: list[PolicyExample],
    settings: PolicySettings | None = None,
    on_step: OnStep | None = None,
    resume_from: Path | None = None,
) -> TrainedAdapter:
    """`settings.steps` gradient steps of the policy loss on all `examples` at once (a LoRA on a
    copy of the base, or the adapter in `resume_from` trained further)."""
    settings = settings or PolicySettings()
    if not examples:
        raise BadRequest("no policy examples: nothing to train on")
    if settings.processes > 1:
        return in_parallel(_train_policy_rank, base, examples, settings, on_step, resume_from)
    seed_everything(settings.seed)
    model = load_lora(base, resume_from) if resume_from is not None else new_lora(base, settings)
    device = next(model.parameters()).device
    pad = pad_id(base)
    batch = make_policy_batch(examples, settings.max_length, pad).to(device)
    old, reference = reference_logprobs(model, batch.batch)

    def next_loss() -> torch.Tensor:
        return policy_loss(token_logprobs(model, batch.batch), old, reference, batch, settings)

    return optimise(model, settings, next_loss, on_step, backend="peft")


def reference_logprobs(model: PeftModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-probs before any update (old) and the base's (the adapter switched off),
    without gradients and without dropout."""
    model.eval()
    with torch.no_grad():
        old = token_logprobs(model, batch)
        with model.disable_adapter():
            base = token_logprobs(model, batch)
    return old, base


def _train_policy_rank(
    group: Group,
    base: Base,
    examples: list[PolicyExample],
    settings: PolicySettings,
    resume_from: Path | None,
    on_step: OnStep | None,
) -> TrainedAdapter:
    model = start_model(group, base, settings, resume_from)
    trainable = [p for p in model.parameters() if p.requires_grad]
    mine = [examples[i] for i in shard(range(len(examples)), group.rank, group.size)]
    if not mine:  # fewer examples than ranks: this rank only joins the collectives

        def next_loss() -> torch.Tensor:
            return sum((p.sum() for p in trainable), torch.zeros(())) * 0.0

        group.all_reduce(torch.zeros(()))  # the count of trained examples, below
    else:
        batch = make_policy_batch(mine, settings.max_length, pad_id(base)).to(device_of(model))
        old, reference = reference_logprobs(model, batch.batch)
        # The policy loss is a mean over the examples that have trained tokens, all ranks' of them.
        trained_here = (batch.mask.sum(dim=1) > 0).float().sum().cpu()
        trained_total = group.all_reduce(trained_here.clone()).clamp(min=1.0).to(old.device)

        def next_loss() -> torch.Tensor:
            new = token_logprobs(model, batch.batch)
            per_example, trained = example_policy_losses(new, old, reference, batch, settings)
            return (per_example * trained).sum() / trained_total

    trained = optimise(model, settings, next_loss, on_step, "peft", synchronise=group.synchronise)
    return finish_rank(group, trained)
