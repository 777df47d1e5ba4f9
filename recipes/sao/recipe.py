"""sao: Single-rollout Asynchronous Optimisation (Hou, Li, Tang, Dong, arXiv:2607.07508).

Group RL (GRPO) samples several answers to a prompt and waits for all of them: the group's mean
score is the baseline. SAO takes one rollout per prompt and trains on it as soon as it is scored:

- a **rollout** is a served call: its prompt, its answer's token ids and the log-prob the engine
  gave each token, all as the record keeps them (nothing is re-tokenised or recomputed);
- its **feedback** is a report with a finite score against the receipt (`POST /reef/report`);
- a scored rollout joins the next **optimiser step** (`batch_size` of them, 1 as the seed
  writes it), with no sibling group and no barrier; the step's LoRA is proposed at once, and once
  released the next request is served by the updated weights;
- a **critic** (a value head beside the LoRA, `reef.training.value`) replaces the group's
  baseline: advantages by GAE with the length-adaptive lambda; the policy loss is the ratio to the
  served log-probs, hard-masked outside [1 - eps_clip, 1 + eps_clip_high]
  (`reef.training.sao`);
- **staleness**: a record served more than `max_staleness` releases before the head (18 as the
  seed writes it) is dropped by the experience view and counted (`stale_skipped` in
  `/reef/status`, `stale_dropped` in the candidate's metrics).

`sao_grpo` is the control arm: the same loss on the same records, but a step waits for
`group_size` scored rollouts of one prompt and each gets score minus its group's mean as the
advantage, with no critic.

Each candidate's metrics carry the step's telemetry: policy lag (releases between serving and
training), queue age (seconds from the score's report to the step), the clipped fraction, the
critic's explained variance and loss, the actor's and critic's gradient norms.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from reef.sdk import (
    ExperienceView,
    LoraRecipeSettings,
    ProposalRefused,
    RecipeSettings,
    StepContext,
    Trajectory,
    Turn,
    WeightRecipe,
    WeightStep,
    served_prompt,
    training_length,
)

if TYPE_CHECKING:
    from reef.sdk import TrainedAdapter

log = logging.getLogger("reef.learning")


class SAOSettings(LoraRecipeSettings):
    batch_size: int = Field(1, ge=1)  # scored rollouts per optimiser step
    max_staleness: int | None = Field(18, ge=0)  # releases a record may lag the head
    learning_rate: float = Field(2e-4, gt=0)
    steps: int = Field(1, ge=1)  # actor optimiser steps per batch: one
    # The paper's values, as upstream's SAO config sets them (reef.training.sao.SAOSettings).
    eps_clip: float = Field(0.3, ge=0.0, lt=1.0)
    eps_clip_high: float = Field(5.0, ge=0.0)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    gae_lambda: float | None = Field(None, ge=0.0, le=1.0)  # none: length-adaptive
    length_alpha: float = Field(1.5, gt=0.0)
    critic_lambda: float = Field(1.0, ge=0.0, le=1.0)
    critic_steps: int = Field(2, ge=0)
    critic_learning_rate: float = Field(1e-3, gt=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)


class SAOGRPOSettings(SAOSettings):
    batch_size: int = Field(1, ge=1)  # groups per optimiser step
    group_size: int = Field(4, ge=2)  # scored rollouts of one prompt a group waits for


def scored_rollout(turn: Turn) -> bool:
    """A rollout SAO can train on: a finite score, and its answer's tokens with the engine's
    log-prob for each."""
    score = turn.score
    tokens = turn.completion_token_ids or []
    served = turn.completion_logprobs or []
    finite = score is not None and math.isfinite(score)
    return finite and bool(tokens) and len(served) == len(tokens)


def release_number(release_id: str) -> int:
    """N of `scenario@N`; 0 for `base`."""
    _, _, number = release_id.rpartition("@")
    return int(number) if number.isdigit() else 0


def scored_at(turn: Turn) -> float | None:
    """When the newest report with a score landed (the store's `created_at`)."""
    times = [
        r["created_at"] for r in turn.reports if r.get("score") is not None and "created_at" in r
    ]
    return max(times) if times else None


def telemetry(turns: list[Turn], head: str, now: float) -> dict[str, Any]:
    """Policy lag (releases between the one that served a rollout and the head it trains on)
    and queue age (seconds from its score's report to this step)."""
    lags = [max(0, release_number(head) - release_number(t.release_id)) for t in turns]
    ages = [now - at for t in turns if (at := scored_at(t)) is not None]
    return {
        "policy_lag_mean": statistics.fmean(lags) if lags else 0.0,
        "policy_lag_max": max(lags, default=0),
        "queue_age_s_mean": statistics.fmean(ages) if ages else None,
        "queue_age_s_max": max(ages) if ages else None,
    }


class SAORecipe(WeightRecipe):
    name = "sao"
    signal = "one report with a finite score per rollout"
    experience = "reactive, from live traffic: each scored rollout on its own"
    Settings = SAOSettings
    settings: SAOSettings
    training = "training a LoRA (SAO)"

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self._stale = 0  # records the last view dropped as stale

    # -- what can be learned from ----------------------------------------------------------------

    def learnable(self, turn: Turn) -> bool:
        return scored_rollout(turn)

    def ready(self, view: ExperienceView) -> bool:
        self._stale = view.counts.stale_skipped
        return super().ready(view)

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        """The oldest trajectories until they hold `batch_size` scored rollouts."""
        self._stale = view.counts.stale_skipped
        return super().build_batch(view)

    def rollouts(self, batch: list[Trajectory]) -> list[tuple[Turn, float | None]]:
        """Each rollout of the batch with its advantage (None: the critic's)."""
        return [(turn, None) for t in batch for turn in t.turns if self.learnable(turn)]

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        rollouts = self.rollouts(batch)
        if not rollouts:
            raise ProposalRefused("no scored rollout with its served tokens and log-probs")
        turns = [turn for turn, _ in rollouts]
        scores = [float(turn.score or 0.0) for turn in turns]
        facts = {
            **telemetry(turns, context.release_id, time.time()),
            "rollouts": len(turns),
            "score_mean": statistics.fmean(scores),
            "stale_dropped": self._stale,
        }
        examples = self.examples(rollouts, context)
        return WeightStep(examples, [turn.record_id for turn in turns], facts=facts)

    def describe(self, step: WeightStep, trained: TrainedAdapter) -> str:
        facts = step.facts
        losses = facts.get("loss") or [float("nan")]
        return (
            f"{self.name}: one optimiser step on {facts['rollouts']} scored rollout(s) (mean "
            f"score {facts['score_mean']:.3f}), loss {losses[-1]:.4f}, clipped "
            f"{facts['clip_fraction'][-1]:.0%} of {facts['tokens']} token(s)"
        )

    def examples(
        self, rollouts: list[tuple[Turn, float | None]], context: StepContext
    ) -> list[Any]:
        """Each rollout as served: the record's prompt ids, answer ids and served log-probs."""
        from reef.sdk import SAOExample

        prompts: dict[str, list[int]] = {}
        return [
            SAOExample(
                prompt_ids=served_prompt(context, turn, prompts),
                completion_ids=list(turn.completion_token_ids or []),
                behaviour_logprobs=list(turn.completion_logprobs or []),
                score=float(turn.score or 0.0),
                advantage=advantage,
            )
            for turn, advantage in rollouts
        ]

    def critic_path(self, context: StepContext) -> Path | None:
        """The scenario's value head, kept in the recipe's work folder across steps."""
        assert context.work_dir is not None
        return context.work_dir / "critic" / f"{context.scenario}.pt"

    def train(
        self, step: WeightStep, base: Any, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        """SAO's update (`reef.training.sao`), its measurements into the step's facts."""
        from reef.sdk import SAOSettings as UpdateSettings
        from reef.sdk import train_sao

        own = self.settings.model_dump()
        shared = {
            name: own[name]
            for name in UpdateSettings.model_fields
            # One process: SAO's update is one small step (`processes` is not passed on).
            if name in own and name not in RecipeSettings.model_fields and name != "processes"
        }
        shared["max_length"] = training_length(self.settings, base)
        result = train_sao(
            base,
            step.examples,
            UpdateSettings(**shared),
            self.critic_path(context),
            self.on_step(context),
            resume_from,
        )
        step.facts.update(result.metrics)
        return result.trained


class SAOGRPO(SAORecipe):
    """The control arm: group baselines (score minus the group's mean) instead of the critic."""

    name = "sao_grpo"
    signal = "groups of scored rollouts of one prompt"
    experience = "reactive, from live traffic: a step waits for a whole group"
    Settings = SAOGRPOSettings
    settings: SAOGRPOSettings

    def groups(self, turns: list[Turn]) -> list[list[Turn]]:
        """Scored rollouts by prompt (the client's messages), oldest group first: those with
        `group_size` or more whose scores differ (equal scores carry no signal and wait)."""
        by_prompt: dict[str, list[Turn]] = {}
        for turn in turns:
            if scored_rollout(turn):
                by_prompt.setdefault(json.dumps(turn.messages, sort_keys=True), []).append(turn)
        return [
            group
            for group in by_prompt.values()
            if len(group) >= self.settings.group_size and len({t.score for t in group}) > 1
        ]

    def ready(self, view: ExperienceView) -> bool:
        self._stale = view.counts.stale_skipped
        return len(self.groups(view.turns())) >= self.settings.batch_size

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        self._stale = view.counts.stale_skipped
        chosen = {
            t.record_id for g in self.groups(view.turns())[: self.settings.batch_size] for t in g
        }
        return [t for t in view.trajectories if any(turn.record_id in chosen for turn in t.turns)]

    def rollouts(self, batch: list[Trajectory]) -> list[tuple[Turn, float | None]]:
        found: list[tuple[Turn, float | None]] = []
        for group in self.groups([turn for t in batch for turn in t.turns]):
            mean = statistics.fmean(float(turn.score or 0.0) for turn in group)
            found.extend((turn, float(turn.score or 0.0) - mean) for turn in group)
        return found

    def critic_path(self, context: StepContext) -> Path | None:
        return None
