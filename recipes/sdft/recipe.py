"""sdft: self-distillation fine-tuning, learning from demonstrations on policy (arXiv 2601.19897).

The teacher is the served model with a demonstration in its context; the student is the same
model without it. A step takes each turn that has something to show the teacher:

- a **demonstration**: feedback `{"demonstration": "..."}`, the answer the user (or the
  scenario's teacher model, which reports its own answers so) wanted;
- a **hint**: feedback text or `{"hint": "..."}` saying what was wanted, put beside the user's
  message as the hindsight recipes put it (`reef.sdk.with_hint`);

and the answer the model itself gave (its tokens as served: the student's own tokens, on
policy, as the paper trains). Each answer token is scored twice by the model, under the
teacher's prompt and the student's, and a LoRA learns to give, without the demonstration, the
next-token distributions the model gives with it (`reef.training.distill`: forward KL over the
vocabulary by default). The teacher is an exponential moving average of the student
(`teacher_update_rate`, 0 freezes the weights the step started from), and each token's loss
is weighted by the capped ratio between the trainer's and the engine's probability of it.

Where this differs from the paper, and why:

- the paper minimises the reverse KL (student ‖ teacher); the default here is the forward KL
  (teacher ‖ student), as upstream Reef's family defaults, and `divergence: reverse` is the
  paper's. On one recorded answer per turn (not fresh rollouts each step) the mass-covering
  direction keeps every token the demonstration-reading model finds likely;
- the student's tokens are the answer served to the user, sampled by the engine under the
  release that served it, not a rollout of the weights being trained: the importance cap
  corrects for the engine's quantised weights and sampling, and `max_staleness` bounds how old
  a release may be. The demonstration's own tokens are never trained on: that is `sft`, the
  off-policy learning the paper shows forgets more.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field

from reef.sdk import (
    BaseWeights,
    ExperienceView,
    KeptTeacherKind,
    LoraRecipeSettings,
    Proposal,
    ProposalRefused,
    Recipe,
    RecipeSettings,
    StepContext,
    Trajectory,
    Turn,
    demonstrations,
    distill_example,
    distilled_on_current,
    hints,
    proposal_kind,
    require_weights,
    with_hint,
)

log = logging.getLogger("reef.learning")
# What the teacher reads after the user's message: our wording of the paper's prompt.
DEMONSTRATION_TEMPLATE = (
    "\n\nHere is an example of a good answer to this:\n\n{demonstration}\n\n"
    "Now give an answer of your own."
)


class SDFTSettings(LoraRecipeSettings):
    batch_size: int = 4  # turns with a demonstration or a hint (and their answer) for a step
    divergence: Literal["forward", "reverse", "jsd"] = "forward"
    jsd_beta: float = Field(0.5, gt=0.0, lt=1.0)
    top_k: int = Field(0, ge=0)  # 0: the whole vocabulary
    teacher_update_rate: float = Field(0.01, ge=0.0, le=1.0)  # the `ema` teacher's rate
    # ema: the student's moving average, kept across steps beside the adapter it taught;
    # initial: the weights the first step started from, frozen ever after; frozen_release: the
    # serving release's adapter, frozen, each step anew (`reef.sdk.weights.TeacherKeeper`).
    teacher: KeptTeacherKind = "ema"
    tis_cap: float | None = Field(2.0, gt=0.0)  # none: no importance-sampling correction
    skip_tokens: int = Field(0, ge=0)  # first answer tokens left out (the paper's runs: 3)
    use_hints: bool = True  # a hint is context for the teacher too, not only a demonstration
    template: str = DEMONSTRATION_TEMPLATE  # `{demonstration}` marks where it goes
    train_batch_size: int = Field(4, ge=1)  # examples per LoRA step
    learning_rate: float = Field(2e-4, gt=0)
    steps: int = Field(8, ge=1)


class SDFT(Recipe):
    name = "sdft"
    trains_weights = True
    signal = "demonstrations and hints, distilled from the model that reads them"
    experience = "reactive, from live traffic: the answers as served (on policy)"
    target = "model (LoRA)"
    Settings = SDFTSettings
    settings: SDFTSettings

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self._base = BaseWeights()

    # -- what can be learned from ----------------------------------------------------------------

    def contexts(self, turn: Turn) -> list[list[dict[str, Any]]]:
        """The teacher's messages for a turn: one per demonstration, and with `use_hints` one
        for its first hint."""
        shown = [
            with_hint(turn.messages, self.settings.template.format(demonstration=text))
            for text in demonstrations(turn)
        ]
        if self.settings.use_hints and not shown:
            shown += [with_hint(turn.messages, hint) for hint in hints(turn)[:1]]
        return shown

    def learnable(self, turn: Turn) -> bool:
        return bool(turn.completion_token_ids) and bool(self.contexts(turn))

    def ready(self, view: ExperienceView) -> bool:
        return view.holds(self.learnable, self.settings.batch_size)

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return view.batch_of(self.learnable, self.settings.batch_size)

    # -- a step ---------------------------------------------------------------------------------

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        require_weights(context, self.name)
        turns = [turn for t in batch for turn in t.turns if self.learnable(turn)]
        if not turns:
            raise ProposalRefused("nothing to distil: no answer with a demonstration or a hint")
        examples = self.examples(turns, context)
        base = self._base.get(context)
        files, trained = distilled_on_current(self.name, self.settings, context, base, examples)
        losses = trained.losses
        return Proposal(
            kind=proposal_kind(self.settings),
            files=files,
            reason=(
                f"SDFT ({self.settings.divergence} KL to the demonstration-reading model) on "
                f"{len(examples)} answer(s) of {len(turns)} turn(s), LoRA r{self.settings.rank}, "
                f"{self.settings.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
            ),
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            metrics={"loss": losses, "examples": len(examples), "turns": len(turns)},
        )

    def examples(self, turns: list[Turn], context: StepContext) -> list[Any]:
        """One example per turn and teacher context: the answer as served, under the prompt as
        served (the student) and under the prompt with the context (the teacher)."""
        prompts: dict[str, list[int]] = {}
        examples = [
            distill_example(context, turn, messages, prompts, f"{turn.record_id}+sdft{index}")
            for turn in turns
            for index, messages in enumerate(self.contexts(turn))
        ]
        log.info("sdft: %d example(s) from %d turn(s)", len(examples), len(turns))
        return examples
