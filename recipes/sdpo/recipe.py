"""sdpo: self-distillation from successes, the model's own correct attempts (arXiv 2601.20802).

A harness asks the same question several times and scores each attempt (`/reef/report`). An
attempt that scored at or above `success_threshold` is correct. For every attempt of a question
that another attempt got right, the teacher is the model reading the question with that correct
sibling's answer after it; the student is the model reading the question alone; the attempt's
own tokens, as served, are scored under both, and a LoRA learns to give without the sibling the
distributions the model gives with it. The loss is the Jensen-Shannon divergence over the
student's 100 likeliest tokens at each position plus one bucket for the rest of the vocabulary
(`reef.training.distill`), the teacher an exponential moving average of the student (rate
0.05), each token weighted by the capped ratio between the trainer's and the engine's
probability of it: the reference implementation's defaults.

An attempt whose question no other attempt answered correctly stays in the step with weight 0
(no target, counted in the mean), as the reference does; a correct attempt never reads its own
answer (`allow_own_success`). Attempts are siblings when their messages are the same: send
each with its own `seed` or `x-reef-session`, or Reef counts them as one call retried.

Where this differs from the paper: the paper samples the group itself each step; here the
attempts are the ones the engine served (the harness samples them), so the importance cap also
covers the release that served them (bounded by `max_staleness`), and a step trains `steps`
times on them instead of once.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any, Literal

from pydantic import Field

from reef.sdk import (
    DistillationRecipe,
    DistillationSettings,
    ExperienceView,
    ProposalRefused,
    StepContext,
    Trajectory,
    Turn,
    WeightStep,
    distill_example,
    records_of,
    with_hint,
)

log = logging.getLogger("reef.learning")
# What the teacher reads after the question: our wording of the reference's reprompt.
SOLUTION_TEMPLATE = (
    "\n\nA correct answer to this question:\n\n{solution}\n\n"
    "Now answer the original question correctly."
)


class SDPOSettings(DistillationSettings):
    batch_size: int = 4  # attempts with a correct sibling needed for a step
    success_threshold: float = 0.5  # a score at or above it is a correct attempt
    allow_own_success: bool = False  # a correct attempt may read its own answer
    # The reference implementation's: the Jensen-Shannon divergence over the student's 100
    # likeliest tokens, the teacher's EMA at 0.05.
    divergence: Literal["forward", "reverse", "jsd"] = "jsd"
    top_k: int = Field(100, ge=0)
    teacher_update_rate: float = Field(0.05, ge=0.0, le=1.0)
    template: str = SOLUTION_TEMPLATE  # `{solution}` marks where the sibling's answer goes
    train_batch_size: int = Field(8, ge=1)
    steps: int = Field(4, ge=1)


def question(turn: Turn) -> str:
    """What makes attempts siblings: the same messages and tools."""
    return json.dumps([turn.messages, turn.tools], sort_keys=True)


class SDPO(DistillationRecipe):
    name = "sdpo"
    signal = "scored attempts at the same question: the correct ones teach the others"
    experience = "reactive, from repeated attempts a harness samples and scores"
    Settings = SDPOSettings
    settings: SDPOSettings

    # -- what can be learned from ----------------------------------------------------------------

    def correct(self, turn: Turn) -> bool:
        return turn.score is not None and turn.score >= self.settings.success_threshold

    def attempts(self, turns: list[Turn]) -> list[tuple[Turn, Turn | None]]:
        """Each scored attempt with its answer's tokens, and the correct sibling its teacher
        reads (the first other correct attempt at the question; None: no target)."""
        groups: dict[str, list[Turn]] = defaultdict(list)
        for turn in turns:
            if turn.score is not None and turn.completion_token_ids:
                groups[question(turn)].append(turn)
        paired = []
        for group in groups.values():
            for turn in group:
                shown = [
                    other
                    for other in group
                    if self.correct(other)
                    and (other is not turn or self.settings.allow_own_success)
                ]
                paired.append((turn, shown[0] if shown else None))
        return paired

    def ready(self, view: ExperienceView) -> bool:
        taught = [turn for turn, sibling in self.attempts(view.turns()) if sibling is not None]
        return len(taught) >= self.settings.batch_size

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        """Whole questions, until they hold `batch_size` attempts with a teacher: every
        trajectory with an attempt at a chosen question, so that its siblings (the correct ones
        among them) are in the same step."""
        chosen: set[str] = set()
        count = 0
        for turn, sibling in self.attempts(view.turns()):
            if count >= self.settings.batch_size:
                break
            if sibling is not None:
                chosen.add(question(turn))
                count += 1
        # The rest of each chosen question's attempts join it, past batch_size if need be.
        return [t for t in view.trajectories if any(question(u) in chosen for u in t.turns)]

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        paired = self.attempts([turn for t in batch for turn in t.turns])
        taught = sum(sibling is not None for _, sibling in paired)
        if not taught:
            raise ProposalRefused("nothing to distil: no attempt has a correct sibling")
        examples = self.examples(paired, context)
        return self.distilling(
            examples, records_of(batch), context, attempts=len(paired), taught=taught
        )

    def summary(self, step: WeightStep) -> str:
        return (
            f"SDPO on {step.facts['attempts']} attempt(s), {step.facts['taught']} with a "
            "correct sibling as the teacher's context"
        )

    def examples(self, paired: list[tuple[Turn, Turn | None]], context: StepContext) -> list[Any]:
        """One example per attempt: the teacher reads its correct sibling beside the question;
        an attempt without one is in the mean with weight 0 (no target)."""
        prompts: dict[str, list[int]] = {}
        examples = []
        for turn, sibling in paired:
            if sibling is None:
                examples.append(distill_example(context, turn, None, prompts, "", weight=0.0))
                continue
            block = self.settings.template.format(solution=sibling.answer_text)
            key = f"{turn.record_id}+sdpo:{sibling.record_id}"
            teacher = with_hint(turn.messages, block)
            examples.append(distill_example(context, turn, teacher, prompts, key))
        log.info("sdpo: %d example(s)", len(examples))
        return examples
