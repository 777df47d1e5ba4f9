"""SAO's update (Single-rollout Asynchronous Optimisation, arXiv:2607.07508): a LoRA step on
scored rollouts, each on its own, with a critic for the baseline.

Each example is one rollout as it was served: the prompt's and the completion's token ids and
the log-probability the serving engine gave each sampled token (the behaviour policy; never
recomputed, never re-tokenised), with the rollout's score. An update:

1. one forward pass of the policy (the LoRA, resumed from the serving release) gives the last
   hidden states; the critic (`value.ValueHead`, saved between steps) reads them detached;
2. advantages by GAE over each completion, the score on its last token (`value.gae`): the
   policy's lambda length-adaptive, the critic's targets with `critic_lambda` (1: Monte Carlo).
   Without a critic (the GRPO control arm), each example brings its own advantage, the same on
   every token;
3. `steps` AdamW steps (1 by default: one rollout batch is one optimiser step) of the SAO loss,
   per token with r = exp(new - behaviour):

       inside_t = 1 if 1 - eps_clip <= r_t <= 1 + eps_clip_high else 0      (no gradient)
       loss_t   = -inside_t * r_t * A_t

   a hard, double-sided mask: a token whose ratio left the trust region contributes nothing,
   whatever the sign of its advantage (PPO's min() would still pass a gradient through one side).
   The loss is the mean over every trained token of the batch (token-level, as DAPO and VAPO);
4. `critic_steps` AdamW steps of the value loss 0.5 (V - R)^2 on the same hidden states.

What it reports per update: the loss, the clipped fraction of tokens, the actor's and the critic's
gradient norms (before clipping at `max_grad_norm`), the critic's loss and explained variance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from reef.errors import BadRequest
from reef.training.adapter import (
    LoraSettings,
    StepThreads,
    TrainedAdapter,
    load_lora,
    new_lora,
    peak_rss_bytes,
    seed_everything,
)
from reef.training.base import Base
from reef.training.distributed import pad_id
from reef.training.policy import PolicyBatch, PolicyExample, make_policy_batch, token_logprobs
from reef.training.value import (
    ValueHead,
    explained_variance,
    gae,
    length_adaptive_lambda,
    terminal_rewards,
    value_loss,
)

OnStep = Callable[[int, float], None]


class SAOSettings(LoraSettings):
    """A LoRA run plus SAO's loss, GAE and critic settings."""

    # The paper's values (upstream's SAO config: --eps-clip 0.3 --eps-clip-high 5.0
    # --sao-lambda-alpha 1.5 --lambd 1.0 --critic-steps-per-actor 2): the band is wide because
    # the behaviour log-probs are the engine's, a quantised model's a little off the trainer's.
    steps: int = Field(1, ge=1)  # actor optimiser steps per batch
    eps_clip: float = Field(0.3, ge=0.0, lt=1.0)  # the ratio's floor: 1 - eps_clip
    eps_clip_high: float = Field(5.0, ge=0.0)  # its ceiling: 1 + eps_clip_high
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    # The policy's GAE lambda; none: length-adaptive, 1 - 1 / (length_alpha * tokens) (alpha
    # 1.5: 0.92 at 8 tokens, 0.97 at 20, so every token of a short answer shares the score).
    gae_lambda: float | None = Field(None, ge=0.0, le=1.0)
    length_alpha: float = Field(1.5, gt=0.0)
    critic_lambda: float = Field(1.0, ge=0.0, le=1.0)  # the critic's targets' lambda
    critic_steps: int = Field(2, ge=0)  # critic optimiser steps per actor update
    critic_learning_rate: float = Field(1e-3, gt=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)


@dataclass
class SAOExample:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]  # one per completion token, as the engine served them
    score: float
    advantage: float | None = None  # the GRPO control's group advantage; None: the critic's

    def __post_init__(self) -> None:
        if len(self.behaviour_logprobs) != len(self.completion_ids):
            tokens = len(self.completion_ids)
            raise ValueError(f"{len(self.behaviour_logprobs)} served log-probs for {tokens} tokens")
        if not math.isfinite(self.score):
            raise ValueError(f"a rollout's score must be finite, not {self.score}")


@dataclass
class SAOResult:
    trained: TrainedAdapter
    metrics: dict[str, Any] = field(default_factory=dict)


def sao_loss(
    new: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's SAO loss (the mean of -inside * r * A over the masked-in tokens) and the
    fraction of those tokens the hard mask left out."""
    ratio = torch.exp(new - behaviour)
    inside = ((ratio >= 1.0 - eps_clip) & (ratio <= 1.0 + eps_clip_high)).float().detach()
    tokens = mask.sum().clamp(min=1.0)
    loss = (-(inside * ratio * advantages) * mask).sum() / tokens
    clipped = ((1.0 - inside) * mask).sum() / tokens
    return loss, clipped.detach()


def completion_positions(batch: PolicyBatch, row: int) -> torch.Tensor:
    """The columns (shifted frame) of `row`'s trained completion tokens, in order."""
    return torch.nonzero(batch.mask[row] > 0, as_tuple=False)[:, 0]


def train_sao(
    base: Base,
    examples: list[SAOExample],
    settings: SAOSettings | None = None,
    critic_path: Path | None = None,
    on_step: OnStep | None = None,
    resume_from: Path | None = None,
) -> SAOResult:
    """One SAO update on `examples`; with `critic_path`, advantages by GAE on the critic saved
    there (trained and saved back), without it each example's own `advantage`."""
    settings = settings or SAOSettings()
    if not examples:
        raise BadRequest("no rollouts: nothing to train on")
    if critic_path is None and any(e.advantage is None for e in examples):
        raise BadRequest("without a critic every rollout needs its advantage")
    seed_everything(settings.seed)
    model = load_lora(base, resume_from) if resume_from is not None else new_lora(base, settings)
    device = next(model.parameters()).device
    plain = [
        PolicyExample(
            e.prompt_ids,
            e.completion_ids,
            [0.0] * len(e.completion_ids),
            None,
            e.behaviour_logprobs,
        )
        for e in examples
    ]
    batch = make_policy_batch(plain, settings.max_length, pad_id(base)).to(device)
    assert batch.behaviour is not None
    metrics: dict[str, Any] = {}
    model.eval()
    with torch.no_grad():
        out = model(
            input_ids=batch.batch.input_ids,
            attention_mask=batch.batch.attention_mask,
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1][:, :-1].detach()
    head = returns = None
    if critic_path is not None:
        head = ValueHead.load_or_new(critic_path, hidden.shape[-1]).to(device)
        returns = _critic_advantages(head, hidden, batch, examples, settings, metrics)
    else:
        for row, example in enumerate(examples):
            assert example.advantage is not None
            batch.advantages[row, completion_positions(batch, row)] = example.advantage

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    losses: list[float] = []
    clip_fractions: list[float] = []
    grad_norms: list[float] = []
    started = time.perf_counter()
    model.train()
    with StepThreads(settings.threads) as threads:
        for step in range(1, settings.steps + 1):
            threads.before_step()
            new = token_logprobs(model, batch.batch)
            loss, clipped = sao_loss(
                new,
                batch.behaviour,
                batch.advantages,
                batch.mask,
                settings.eps_clip,
                settings.eps_clip_high,
            )
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(trainable, settings.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            threads.after_step()
            losses.append(float(loss.detach()))
            clip_fractions.append(float(clipped))
            grad_norms.append(float(norm))
            if on_step is not None:
                on_step(step, losses[-1])
    model.eval()
    if head is not None and returns is not None and critic_path is not None:
        _train_critic(head, hidden, returns, batch.mask, settings, metrics)
        head.cpu().save(critic_path)
    metrics.update(
        {
            "loss": losses,
            "clip_fraction": clip_fractions,
            "actor_grad_norm": grad_norms,
            "tokens": int(batch.mask.sum()),
        }
    )
    trained = TrainedAdapter(
        model=model,
        losses=losses,
        peak_memory_bytes=peak_rss_bytes(),
        seconds=time.perf_counter() - started,
        backend="peft",
        settings=settings,
    )
    return SAOResult(trained, metrics)


def _critic_advantages(
    head: ValueHead,
    hidden: torch.Tensor,
    batch: PolicyBatch,
    examples: list[SAOExample],
    settings: SAOSettings,
    metrics: dict[str, Any],
) -> torch.Tensor:
    """GAE advantages into `batch.advantages` from the critic's values; the critic's targets."""
    with torch.no_grad():
        values = head(hidden)
    returns = torch.zeros_like(values)
    lambdas = []
    for row, example in enumerate(examples):
        columns = completion_positions(batch, row)
        row_values = values[row, columns].tolist()
        rewards = terminal_rewards(example.score, len(row_values))
        lam = settings.gae_lambda
        if lam is None:
            lam = length_adaptive_lambda(len(row_values), settings.length_alpha)
        lambdas.append(lam)
        advantages, _ = gae(rewards, row_values, settings.gamma, lam)
        _, targets = gae(rewards, row_values, settings.gamma, settings.critic_lambda)
        batch.advantages[row, columns] = torch.tensor(advantages, device=values.device)
        returns[row, columns] = torch.tensor(targets, device=values.device)
    trained = batch.mask > 0
    metrics["gae_lambda"] = lambdas
    metrics["value_mean"] = float(values[trained].mean())
    metrics["advantage_mean"] = float(batch.advantages[trained].mean())
    metrics["critic_explained_variance"] = explained_variance(values[trained], returns[trained])
    return returns


def _train_critic(
    head: ValueHead,
    hidden: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    settings: SAOSettings,
    metrics: dict[str, Any],
) -> None:
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.critic_learning_rate)
    losses: list[float] = []
    norms: list[float] = []
    for _ in range(settings.critic_steps):
        loss = value_loss(head(hidden), returns, mask)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(head.parameters()), settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    metrics["critic_loss"] = losses
    metrics["critic_grad_norm"] = norms
