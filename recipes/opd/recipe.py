"""opd: on-policy distillation from a frozen teacher, on the answers the model itself gave.

The student samples (the engine serves the scenario's calls); a frozen teacher of the same
vocabulary scores the exact tokens the student produced, and the student is trained on the
sampled reverse KL: at each answer token, log p_student - log p_teacher, a per-token penalty
whose gradient is the policy gradient with advantage log p_teacher - log p_student
(`reef.training.distill`, divergence `sampled_reverse`), each token weighted by the capped ratio
between the trainer's and the engine's probability of it. This is on-policy distillation as
Agarwal et al. (GKD, arXiv 2306.13649) and Thinking Machines' "On-Policy Distillation" describe
it: dense, per-token teaching on the student's own mistakes, no reward, no judge. No feedback
is needed: every answer whose tokens were recorded is a sample.

The teacher (`teacher`, required: there is no teacher to default to):

- `base`: the weights the scenario trains on, the adapter switched off (the served model, or
  the serving release's checkpoint): it pulls a served adapter back toward them, a regulariser
  more than a teacher; with no LoRA serving (a fresh adapter, which it could teach nothing:
  loss and gradient 0) a step is refused, saying so;
- a folder or a GGUF file: another checkpoint of the same vocabulary (a stronger model, a
  checkpoint release written out), loaded once and kept; refused when its vocabulary is not
  the served model's. A relative path is relative to the folder Reef runs in.

What runs here: both, on the CPU (torch and peft). A teacher behind an upstream endpoint would
have to return the log-probabilities of given tokens, which the OpenAI chat API does not do,
so that is not offered.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from reef.sdk import (
    LoraRecipeSettings,
    ProposalRefused,
    RecipeError,
    RecipeSettings,
    StepContext,
    Trajectory,
    WeightRecipe,
    WeightStep,
    distill_example,
)

if TYPE_CHECKING:
    from reef.sdk import TrainedAdapter

log = logging.getLogger("reef.learning")


NO_TEACHER = (
    "opd needs `teacher`: the path of a checkpoint folder or GGUF file of a stronger model with "
    "the served model's vocabulary (or `base`, which only pulls a served adapter back toward "
    "the base weights: to a fresh adapter it teaches nothing)"
)


class OPDSettings(LoraRecipeSettings):
    batch_size: int = 4  # answers with recorded tokens needed for a step
    teacher: str | None = None  # `base`, or the path of a checkpoint folder or GGUF file
    tis_cap: float | None = Field(2.0, gt=0.0)  # none: no importance-sampling correction
    skip_tokens: int = Field(0, ge=0)
    train_batch_size: int = Field(4, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    steps: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _a_teacher(self) -> OPDSettings:
        if not self.teacher:
            raise ValueError(NO_TEACHER)
        return self


class OPD(WeightRecipe):
    name = "opd"
    signal = "a frozen teacher's log-probabilities of the model's own answers"
    experience = "reactive, from live traffic: the answers as served (on policy)"
    Settings = OPDSettings
    settings: OPDSettings
    training = "distilling a LoRA"

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self._teacher: tuple[Path, Any] | None = None

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        turns = [turn for t in batch for turn in t.turns if self.learnable(turn)]
        if not turns:
            raise ProposalRefused("nothing to distil: no answer with recorded tokens")
        prompts: dict[str, list[int]] = {}
        # The teacher, another model, reads the same prompt as the student.
        examples = [distill_example(context, turn, None, prompts, "") for turn in turns]
        consumed = [turn.record_id for turn in turns]
        return WeightStep(examples, consumed, facts={"examples": len(examples)})

    def summary(self, step: WeightStep) -> str:
        return (
            f"on-policy distillation from {self.settings.teacher} on {len(step.examples)} "
            "answer(s) (the loss is the log-ratio)"
        )

    def teacher_model(self, context: StepContext, base: Any) -> Any:
        """The frozen teacher checkpoint, loaded once (None for `base`); refused unless its
        vocabulary is the served model's."""
        from reef.sdk import load_base

        if self.settings.teacher == "base":
            return None
        assert context.work_dir is not None
        path = Path(self.settings.teacher).expanduser().resolve()
        if self._teacher is None or self._teacher[0] != path:
            if not path.exists():
                raise RecipeError(f"opd's teacher {path} does not exist")
            loaded = load_base(path, context.work_dir / "teacher", progress=log.info)
            if loaded.tokenizer.get_vocab() != base.tokenizer.get_vocab():
                raise RecipeError(
                    f"opd's teacher {path} has another vocabulary than the served model: "
                    "it cannot score the student's tokens"
                )
            self._teacher = (path, loaded.model)
        return self._teacher[1]

    def train(
        self, step: WeightStep, base: Any, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        if self.settings.teacher == "base" and resume_from is None:
            # A fresh adapter starts as the base: the log-ratio is 0 at every token, and so is
            # its gradient. Training would spend the step and propose the base again.
            raise ProposalRefused(
                "opd's teacher `base` teaches a fresh adapter nothing (the student starts as "
                "the base: loss and gradient 0); it only pulls a served LoRA back toward the "
                "base. Name a stronger checkpoint as `teacher`, or serve a LoRA release first"
            )
        teacher = self.teacher_model(context, base)
        return self.distil(
            step,
            base,
            context,
            resume_from,
            teacher_model=teacher,
            divergence="sampled_reverse",
            teacher="base" if teacher is None else "model",
        )
