"""`WeightRecipe`: the base of the recipes that train the served model's weights.

trl's shape: one trainer per algorithm over shared pieces. A weight recipe writes its algorithm:

- what it learns from: `learnable(turn)` (a step waits for `batch_size` of them), or its own
  `ready` and `build_batch`;
- `plan(batch, context)`: the step's examples, as a `WeightStep` (raise `ProposalRefused` when
  there is nothing to learn);
- `train(step, base, context, resume_from)`: its update, continuing `resume_from`;
- `summary(step)`: what the step trained on, for the candidate's reason (or all of
  `describe(step, trained)`).

The base owns what every such step does the same way: a step without local weights is refused;
the run continues the adapter that serves; the result is proposed as that adapter, or merged
into the weights it trained on (`checkpoint: true`); a distillation's teacher is kept beside the
adapter it taught; the candidate's metrics are the losses and what the step counted.
`DistillationRecipe` adds the distillation update toward the kept teacher (`sdft`, `sdpo`).

Importing this module imports no torch: the server loads recipes too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from reef.evaluation.tasks import EvalTask
from reef.sdk.recipe import Proposal, Recipe, RecipeSettings, StepContext
from reef.sdk.view import ExperienceView, Trajectory, Turn
from reef.sdk.weights import (
    BaseWeights,
    KeptTeacherKind,
    LoraRecipeSettings,
    TeacherKeeper,
    distillation,
    proposal_kind,
    reporter,
    require_weights,
    train_on_current,
)

if TYPE_CHECKING:
    from reef.training import Base, TrainedAdapter


@dataclass
class WeightStep:
    """What one step of a weight recipe trains on, as its `plan` found it."""

    examples: list[Any]
    consumed: list[str]  # the record ids the step uses up
    # What the step counted (and its `train` measured), kept on the candidate as metrics.
    facts: dict[str, Any] = field(default_factory=dict)
    eval_tasks: list[EvalTask] = field(default_factory=list)  # run by the gate beside evals/
    # A distillation's teacher, kept across steps beside the adapter it taught.
    teacher: TeacherKeeper | None = None


def records_of(batch: list[Trajectory]) -> list[str]:
    """Every record id of a batch: what a step that learns from whole trajectories consumes."""
    return [record for trajectory in batch for record in trajectory.record_ids]


class WeightRecipe(Recipe):
    """A recipe whose candidate is the served model's weights, trained on its step's examples."""

    trains_weights = True
    target = "model (LoRA)"
    Settings: ClassVar[type[RecipeSettings]] = LoraRecipeSettings
    settings: LoraRecipeSettings
    training: ClassVar[str] = "training a LoRA"  # what the progress bar says while it trains

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self.weights = BaseWeights()

    # -- what can be learned from ----------------------------------------------------------------

    def learnable(self, turn: Turn) -> bool:
        """A turn the recipe learns from; by default one whose answer's tokens were recorded."""
        return bool(turn.completion_token_ids)

    def ready(self, view: ExperienceView) -> bool:
        return view.holds(self.learnable, self.settings.batch_size)

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return view.batch_of(self.learnable, self.settings.batch_size)

    def waiting_for(self, view: ExperienceView) -> str | None:
        found = sum(self.learnable(turn) for turn in view.turns())
        return (
            f"{found} of the {self.settings.batch_size} turns a batch needs ({self.signal})"
        )

    # -- the algorithm: each recipe's own --------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        raise NotImplementedError

    def train(
        self, step: WeightStep, base: Base, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        raise NotImplementedError

    def summary(self, step: WeightStep) -> str:
        """What the step trained on, for its reason ("SDPO on 8 attempt(s)...")."""
        raise NotImplementedError

    def describe(self, step: WeightStep, trained: TrainedAdapter) -> str:
        """The candidate's reason: the step's summary, the LoRA run and its loss."""
        losses = trained.losses
        return (
            f"{self.summary(step)}, LoRA r{self.settings.rank}, {self.settings.steps} steps, "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        )

    def distil(
        self,
        step: WeightStep,
        base: Base,
        context: StepContext,
        resume_from: Path | None,
        **options: Any,
    ) -> TrainedAdapter:
        """The distillation update on the step's examples (`reef.sdk.weights.distillation`),
        with the recipe's settings and `options` on top: for a recipe whose `train` distils."""
        on_step = self.on_step(context)
        return distillation(self.settings, base, step.examples, on_step, resume_from, **options)

    # -- the step every weight recipe takes ------------------------------------------------------

    def base(self, context: StepContext) -> Base:
        """The weights the scenario serves on, loaded once and kept while they serve."""
        return self.weights.get(context)

    def on_step(self, context: StepContext) -> Callable[[int, float], Any]:
        """An `on_step(step, loss)` for the training run: logged, and the CLI's progress bar."""
        return reporter(context, self.name, self.training, self.settings.steps)

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        require_weights(context, self.name)
        step = self.plan(batch, context)
        base = self.base(context)

        def run(resume_from: Path | None) -> TrainedAdapter:
            return self.train(step, base, context, resume_from)

        merge_into = base if self.settings.checkpoint else None
        try:
            files, trained = train_on_current(context, run, merge_into=merge_into)
            if step.teacher is not None:
                step.teacher.keep(files)
        finally:
            if step.teacher is not None:
                step.teacher.forget_scratch()  # a step that failed keeps no half-made teacher
        return Proposal(
            kind=proposal_kind(self.settings),
            files=files,
            reason=self.describe(step, trained),
            consumed_record_ids=step.consumed,
            eval_tasks=step.eval_tasks,
            metrics={"loss": list(trained.losses), **step.facts},
        )


class DistillationSettings(LoraRecipeSettings):
    """The settings every `DistillationRecipe` has (`reef.training.DistillSettings` by name); a
    recipe declares a field again to change its default."""

    divergence: Literal["forward", "reverse", "jsd"] = "forward"
    jsd_beta: float = Field(0.5, gt=0.0, lt=1.0)  # the teacher's weight in the mixture
    top_k: int = Field(0, ge=0)  # the student's top k tokens plus a tail; 0: everything
    teacher_update_rate: float = Field(0.01, ge=0.0, le=1.0)  # the `ema` teacher's rate
    # ema: the student's moving average, kept across steps beside the adapter it taught;
    # initial: the weights the first step started from, frozen ever after; frozen_release: the
    # serving release's adapter, frozen, each step anew (`TeacherKeeper`).
    teacher: KeptTeacherKind = "ema"
    tis_cap: float | None = Field(2.0, gt=0.0)  # none: no importance-sampling correction
    skip_tokens: int = Field(0, ge=0)  # first answer tokens left out (sdft's paper runs: 3)
    train_batch_size: int = Field(4, ge=1)  # examples per LoRA step
    learning_rate: float = Field(2e-4, gt=0)


class DistillationRecipe(WeightRecipe):
    """A weight recipe that distils its examples (`DistillExample`s: the answer as served, under
    the student's prompt and the teacher's) toward an EMA teacher its `teacher` setting keeps
    across steps (`TeacherKeeper`): `sdft`, `sdpo`. Its `plan` returns `distilling(...)`."""

    Settings: ClassVar[type[RecipeSettings]] = DistillationSettings
    settings: DistillationSettings
    training = "distilling a LoRA"

    def distilling(
        self, examples: list[Any], consumed: list[str], context: StepContext, **facts: Any
    ) -> WeightStep:
        """The step that distils `examples`, with the teacher its settings keep."""
        return WeightStep(
            examples,
            consumed,
            facts={"examples": len(examples), **facts},
            teacher=TeacherKeeper(context, self.settings.teacher),
        )

    def train(
        self, step: WeightStep, base: Base, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        return self.distil(step, base, context, resume_from, kept=step.teacher, teacher="ema")
