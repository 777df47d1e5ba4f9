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
from typing import Any

from pydantic import Field

from reef.sdk import (
    DistillationRecipe,
    DistillationSettings,
    ProposalRefused,
    StepContext,
    Trajectory,
    Turn,
    WeightStep,
    demonstrations,
    distill_example,
    hints,
    records_of,
    sound_answers,
    with_hint,
)

log = logging.getLogger("reef.learning")
# What the teacher reads after the user's message: our wording of the paper's prompt.
DEMONSTRATION_TEMPLATE = (
    "\n\nHere is an example of a good answer to this:\n\n{demonstration}\n\n"
    "Now give an answer of your own."
)


class SDFTSettings(DistillationSettings):
    batch_size: int = 4  # turns with a demonstration or a hint (and their answer) for a step
    use_hints: bool = True  # a hint is context for the teacher too, not only a demonstration
    template: str = DEMONSTRATION_TEMPLATE  # `{demonstration}` marks where it goes
    steps: int = Field(8, ge=1)


class SDFT(DistillationRecipe):
    name = "sdft"
    signal = "demonstrations and hints, distilled from the model that reads them"
    reads_feedback_text = True
    experience = "reactive, from live traffic: the answers as served (on policy)"
    Settings = SDFTSettings
    settings: SDFTSettings

    # -- what can be learned from ----------------------------------------------------------------

    def contexts(self, turn: Turn) -> list[list[dict[str, Any]]]:
        """The teacher's messages for a turn: one per demonstration, and with `use_hints` one
        for its first hint."""
        shown = [
            with_hint(turn.messages, self.settings.template.format(demonstration=text))
            for text in sound_answers(turn, demonstrations(turn))
        ]
        if self.settings.use_hints and not shown:
            shown += [with_hint(turn.messages, hint) for hint in hints(turn)[:1]]
        return shown

    def learnable(self, turn: Turn) -> bool:
        return bool(turn.completion_token_ids) and bool(self.contexts(turn))

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        turns = [turn for t in batch for turn in t.turns if self.learnable(turn)]
        if not turns:
            raise ProposalRefused("nothing to distil: no answer with a demonstration or a hint")
        examples = self.examples(turns, context)
        return self.distilling(examples, records_of(batch), context, turns=len(turns))

    def summary(self, step: WeightStep) -> str:
        return (
            f"SDFT ({self.settings.divergence} KL to the demonstration-reading model) on "
            f"{len(step.examples)} answer(s) of {step.facts['turns']} turn(s)"
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
