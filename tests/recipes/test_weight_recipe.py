"""`WeightRecipe`, the skeleton every weight recipe's step shares, on a real experience store and
the tiny random model: a recipe of a few lines (its examples and its update) proposes the
served adapter trained on, with its metrics and tasks; checkpoint merges; a failed step keeps no
half-made teacher; a step without local weights is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reef.artifacts import CHECKPOINT, part_of
from reef.sdk import (
    DistillationRecipe,
    DistillationSettings,
    EvalTask,
    LoraRecipeSettings,
    RecipeError,
    ScorerSpec,
    StepContext,
    Trajectory,
    WeightRecipe,
    WeightStep,
    records_of,
)
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore
from tests.support.distillation import Engine, served, step_context, store, tiny_model
from tests.support.training import one_thread

__all__ = ["one_thread", "store", "tiny_model"]  # shared fixtures, used by name

TASK = EvalTask(
    id="echo:task",
    messages=[{"role": "user", "content": "Say hi."}],
    scorer=ScorerSpec(type="contains", value="hi"),
)


class Echo(WeightRecipe):
    """Supervised learning on the answers as served: the smallest algorithm."""

    name = "echo"

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        from reef.sdk import TrainingExample

        turns = [turn for t in batch for turn in t.turns if self.learnable(turn)]
        examples = [
            TrainingExample(list(turn.prompt_token_ids or []), list(turn.completion_token_ids))
            for turn in turns
        ]
        return WeightStep(examples, records_of(batch), {"turns": len(turns)}, [TASK])

    def train(self, step: WeightStep, base: Any, context: StepContext, resume_from: Any) -> Any:
        from reef.sdk import LoraSettings, train_lora

        settings = LoraSettings(steps=self.settings.steps, max_length=128, threads=1)
        return train_lora(base, step.examples, settings, self.on_step(context), resume_from)

    def summary(self, step: WeightStep) -> str:
        return f"echo on {step.facts['turns']} turn(s)"


def batch(store: ExperienceStore, recipe: WeightRecipe) -> list[Trajectory]:
    return recipe.build_batch(ExperienceView(store, "default", consumed=set()))


def test_a_recipe_of_its_algorithm_only_proposes_the_adapter_with_its_facts(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    records = [served(store, "Name a fish.", "Cod."), served(store, "Name a bird.", "Robin.")]
    recipe = Echo(LoraRecipeSettings(batch_size=2, steps=3))
    proposal = recipe.propose(batch(store, recipe), step_context(tiny_model, tmp_path, Engine()))
    assert proposal is not None and proposal.kind == "lora"
    assert sorted(proposal.consumed_record_ids) == sorted(records)
    assert proposal.eval_tasks == [TASK]
    assert proposal.metrics["turns"] == 2 and len(proposal.metrics["loss"]) == 3
    assert proposal.reason.startswith("echo on 2 turn(s), LoRA r8, 3 steps, loss ")
    assert "peft/adapter_config.json" in proposal.files


def test_checkpoint_proposes_the_adapter_merged_into_full_weights(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "Name a fish.", "Cod.")
    recipe = Echo(LoraRecipeSettings(batch_size=1, steps=1, checkpoint=True))
    proposal = recipe.propose(batch(store, recipe), step_context(tiny_model, tmp_path, Engine()))
    assert proposal is not None and proposal.kind == "checkpoint"
    assert {part_of(path) for path in proposal.files} == {CHECKPOINT}


class Failing(DistillationRecipe):
    """A distillation whose update fails after its teacher started being written."""

    name = "failing"

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        return self.distilling([], records_of(batch), context)

    def train(self, step: WeightStep, base: Any, context: StepContext, resume_from: Any) -> Any:
        assert step.teacher is not None and step.teacher.scratch is not None
        step.teacher.scratch.parent.mkdir(parents=True, exist_ok=True)
        step.teacher.scratch.write_bytes(b"half a teacher")
        raise RuntimeError("the update failed")

    def summary(self, step: WeightStep) -> str:
        return "never"


def test_a_failed_step_keeps_no_half_made_teacher(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "Name a fish.", "Cod.")
    recipe = Failing(DistillationSettings(batch_size=1))
    with pytest.raises(RuntimeError, match="the update failed"):
        recipe.propose(batch(store, recipe), step_context(tiny_model, tmp_path, Engine()))
    assert list((tmp_path / "teachers").rglob("*.pt")) == []


def test_a_step_without_local_weights_is_refused_by_name(store: ExperienceStore) -> None:
    served(store, "Name a fish.", "Cod.")
    recipe = Echo(LoraRecipeSettings(batch_size=1))
    upstream = StepContext(scenario="default", release_id="base", files={})
    with pytest.raises(RecipeError, match="echo trains the served model's weights"):
        recipe.propose(batch(store, recipe), upstream)
