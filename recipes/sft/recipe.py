"""sft: rejection-sampling fine-tuning of a LoRA adapter, from what users said they wanted.

A step gathers training examples, each a prompt as the engine renders it and a completion:

- **good answers**: turns scored at or above `threshold`, the prompt and the answer's tokens as
  served (a record without its prompt's tokens is rendered again, with its call's tools);
- **demonstrations**: feedback `{"demonstration": "..."}` on a turn, the user's own answer;
- **hindsight answers**: for a turn scored below `threshold` whose feedback says what was wanted,
  the served model rewrites its answer as the feedback asks, and is asked again with that
  feedback beside the user's message (`reef.sdk.hindsight`): the answers the `scorer`
  accepts (the model as judge, without a scorer) that still answer the question are what the
  model should have said, and it learns to say them to the original prompt, without the hint.

- **hint examples** (`hint_distillation`): a failing turn with feedback for which no hindsight
  answer was kept (on the embedded 135M model, no sampled or revised answer meets plain
  feedback) still teaches. The model with the feedback in its context is a better teacher than
  the model without it, so the turn's own answer, its tokens as served (on policy, as
  OpenClaw-RL's hindsight on-policy distillation and SDFT train), is scored under the prompt
  with the feedback beside the user's message (`with_hint`, rendered as the engine renders
  it: the teacher) and under the prompt as served (the student), and the LoRA learns to give,
  without the feedback, the next-token distributions the model gives with it
  (`reef.training.distill`, forward KL over the vocabulary by default; `hint_divergence:
  sampled_reverse` is OPD's per-token log-ratio on the served tokens). No answer is sampled
  under the hint for it: those samples are what relabelling already asked for and refused, and
  training on the teacher's tokens would be off-policy imitation, which is what relabelling is.

Beside them it replays what the agent already does elsewhere, so that learning one thing does
not cost it the rest: the current release's own greedy answers to `replay` other questions (the
scenario's latest calls outside the batch, else a few general questions) join the examples.

It trains a LoRA on them with `reef.training` (continuing the current release's adapter when the
scenario already serves one), on prompts as they were served: the supervised examples (good
answers, demonstrations, hindsight answers and the replayed ones) with the cross-entropy loss
(`train_lora`, `steps`), then, where there are hint examples, the same adapter further with the
distillation loss (`distill`, `hint_steps`), the replayed answers beside them as anchors (the
teacher reads their prompt unchanged, so they hold the model where the first run left it). The
teacher is that adapter as the distillation run starts, frozen by default (the release that
served the turns, plus what the first run learned), reading the feedback. One step, one
candidate. (`distill` has no cross-entropy term, and a distillation example whose teacher reads
the student's prompt is not one: it pulls toward the teacher's distributions, not the
completion's tokens, so the two losses run one after the other.) It exports
it as a PEFT folder and a llama.cpp GGUF adapter, and proposes it as a `lora` candidate: the worker
keeps the serving harness beside it (an `agent` release when there is one). The worker's gate then
compares it with the current release on the scenario's eval tasks (and the held-out failing
calls, when a scorer is set), on the serving engine. Training runs in the learning worker, never
in the server: serving goes on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from reef.sdk import (
    LoraRecipeSettings,
    ProgramScorer,
    ProposalRefused,
    StepContext,
    Trajectory,
    Turn,
    WeightRecipe,
    WeightStep,
    asking,
    content_judge_for,
    demonstrations,
    distill_example,
    distillation,
    feedback_of,
    hints,
    records_of,
    relabel,
    reporter,
    served_prompt,
    sound_answers,
    training_length,
    with_hint,
)

if TYPE_CHECKING:
    from reef.sdk import TrainedAdapter

log = logging.getLogger("reef.learning")
# Replayed when the scenario has too few other calls: plain questions of every kind.
GENERAL_QUESTIONS = [
    "What do bees make?",
    "How many days are in a week?",
    "What is the opposite of up?",
    "Which animal says moo?",
    "What is ice made of?",
    "Name a shape with three sides.",
]


class SFTSettings(LoraRecipeSettings):
    batch_size: int = 4  # learnable turns needed before a step
    threshold: float = 0.5  # a score at or above it is a good answer; below it, a failure
    # Accepts hindsight answers (and scores the held-out failing calls as extra gate tasks).
    scorer: ProgramScorer | None = None
    hindsight_samples: int = Field(4, ge=1, le=16)
    hindsight_keep: int = Field(2, ge=1, le=16)  # answers kept per failing turn
    # Rewrites of a failing answer asked under its feedback (0: none), of the served model or of
    # the proposer model (learning.proposer_*: a stronger one, where configured).
    hindsight_revisions: int = Field(2, ge=0, le=16)
    reviser: Literal["served", "proposer"] = "served"
    # Whether a hindsight answer still answers the question: by its words (within one language),
    # or as the proposer model judges it (in any language: for a preference such as French).
    content_check: Literal["words", "proposer"] = "words"
    max_tokens: int = Field(128, ge=8)  # for hindsight and replayed answers
    train_batch_size: int = Field(4, ge=1)  # examples per LoRA step (see LoraRecipeSettings)
    # Other questions whose current answers are trained on beside the new examples, so the
    # model keeps answering as it did (0: none).
    replay: int = Field(4, ge=0)
    # A replayed answer cut at max_tokens counts too, its tokens as served: it ends without the
    # end of turn, so it teaches no stop. (The 135M model finishes 2 of the 6 general questions
    # within 48 tokens, so with finished answers only it replays 2, whatever `replay` says.)
    replay_cut_answers: bool = False
    # A failing turn with feedback and no hindsight answer kept: its served answer distilled
    # from the model reading the feedback (see the module's docstring).
    hint_distillation: bool = True
    hint_divergence: Literal["forward", "reverse", "jsd", "sampled_reverse"] = "forward"
    # Each hint example's weight in the distillation loss, against 1 for each replayed answer.
    hint_weight: float = Field(1.0, gt=0.0)
    hint_steps: int | None = Field(None, ge=1)  # the distillation run's steps; none: `steps`
    hint_teacher_update_rate: float = Field(0.0, ge=0.0, le=1.0)  # 0: a frozen teacher
    hint_tis_cap: float | None = Field(2.0, gt=0.0)  # none: no importance-sampling correction


@dataclass
class SFTStep(WeightStep):
    """A step's supervised examples (`examples`), and beside them the failing answers to distil
    from the model reading their feedback and the replayed answers that anchor both runs."""

    hinted: list[Any] = field(default_factory=list)
    replayed: list[Any] = field(default_factory=list)


class SFT(WeightRecipe):
    name = "sft"
    signal = "good scores, demonstrations, and feedback that says what was wanted"
    reads_feedback_text = True
    experience = "reactive, from live traffic, relabelled in hindsight"
    Settings = SFTSettings
    settings: SFTSettings

    # -- what can be learned from ----------------------------------------------------------------

    def good(self, turn: Turn) -> bool:
        return turn.score is not None and turn.score >= self.settings.threshold

    def failing_with_hint(self, turn: Turn) -> bool:
        """Below `threshold` (or unscored) with feedback in words; a turn scored below it whose
        conversation went on has the user's next message for feedback (`feedback_of`)."""
        if turn.score is not None and turn.score < self.settings.threshold:
            return bool(feedback_of(turn))
        return turn.score is None and bool(hints(turn))

    def learnable(self, turn: Turn) -> bool:
        return self.good(turn) or bool(demonstrations(turn)) or self.failing_with_hint(turn)

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> SFTStep:
        from reef.sdk import TrainingExample

        turns = [turn for t in batch for turn in t.turns]
        pairs = self._completions(turns, context)
        to_distil = self._hinted(turns, pairs)
        if not pairs and not to_distil:
            raise ProposalRefused("nothing to train on: no good answer, demonstration or hint")
        base = self.base(context)
        prompts: dict[str, list[int]] = {}  # record id -> rendered prompt, once per turn
        hinted = self._hint_examples(to_distil, context, prompts)
        examples = [
            TrainingExample(served_prompt(context, turn, prompts), completion)
            for turn, completion in self._tokenized(pairs, base)
        ]
        replayed = self._replayed(context, {tuple(map(str, t.messages)) for t in turns})
        facts = {
            "examples": len(examples) + len(hinted),
            "supervised": len(examples),
            "hint_examples": len(hinted),
            "replayed": len(replayed),
            "turns": len(turns),
        }
        return SFTStep(examples, records_of(batch), facts, hinted=hinted, replayed=replayed)

    def describe(self, step: WeightStep, trained: TrainedAdapter) -> str:
        facts = step.facts
        ran = [
            f"{name} loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps"
            for name in ("sft", "hint")
            if (losses := facts.get(f"{name}_loss"))
        ]
        return (
            f"LoRA r{self.settings.rank} on {facts['supervised']} example(s) and "
            f"{facts['hint_examples']} hint example(s) from {facts['turns']} turn(s) and "
            f"{facts['replayed']} replayed, " + ", ".join(ran)
        )

    def _hinted(self, turns: list[Turn], pairs: list[tuple[Turn, list[int] | str]]) -> list[Turn]:
        """The failing turns with feedback that nothing relabelled taught (no hindsight answer
        kept), with their answer's tokens as served: to distil from the model that reads the
        feedback."""
        if not self.settings.hint_distillation:
            return []
        taught = {turn.record_id for turn, _ in pairs}
        return [
            turn
            for turn in turns
            if self.failing_with_hint(turn)
            and turn.record_id not in taught
            and turn.completion_token_ids
        ]

    def _hint_examples(
        self, turns: list[Turn], context: StepContext, prompts: dict[str, list[int]]
    ) -> list[Any]:
        """One distillation example per turn: its answer as served, under the prompt as served
        (the student) and under the same messages with its first feedback beside the user's
        message (the teacher), as the engine renders them."""
        examples = []
        for turn in turns:
            teacher = with_hint(turn.messages, feedback_of(turn)[0])
            key = f"{turn.record_id}+hint"
            weight = self.settings.hint_weight
            examples.append(distill_example(context, turn, teacher, prompts, key, weight=weight))
        if examples:
            log.info("sft: %d hint example(s) to distil", len(examples))
        return examples

    def _completions(
        self, turns: list[Turn], context: StepContext
    ) -> list[tuple[Turn, list[int] | str]]:
        """What each turn should have answered: token ids as served, or a text to tokenize."""
        assert context.generate is not None
        pairs: list[tuple[Turn, list[int] | str]] = []
        for turn in turns:
            served = [turn.answer_text] if self.good(turn) and turn.completion_token_ids else []
            if sound_answers(turn, served, context.dropped):
                pairs.append((turn, list(turn.completion_token_ids or [])))
            shown = sound_answers(turn, demonstrations(turn), context.dropped)
            pairs.extend((turn, text) for text in shown)
        failing = [turn for turn in turns if self.failing_with_hint(turn)]
        # The proposer model revises where the settings choose it, else the served model.
        ask = context.ask if self.settings.reviser == "proposer" else None
        for item in relabel(
            failing,
            context.generate,
            self.settings.scorer,
            samples=self.settings.hindsight_samples,
            keep=self.settings.hindsight_keep,
            max_tokens=self.settings.max_tokens,
            revisions=self.settings.hindsight_revisions,
            reviser=asking(ask) if ask is not None else None,
            content_judge=content_judge_for(self.settings.content_check, context.ask),
            dropped=context.dropped,
        ):
            pairs.append((item.turn, item.completion_token_ids or item.answer))
        log.info("sft: %d example(s) from %d turn(s)", len(pairs), len(turns))
        return pairs

    def _replayed(self, context: StepContext, learned: set[tuple[str, ...]]) -> list[Any]:
        """The current release's finished greedy answers (with `replay_cut_answers`, cut ones
        too; never one the engine ended for looping) to `replay` questions outside what is
        learned from, as training examples (prompt and answer token ids as served)."""
        from reef.sdk import TrainingExample

        assert context.generate is not None
        questions = [m for m in context.anchors if tuple(map(str, m)) not in learned]
        questions += [[{"role": "user", "content": q}] for q in GENERAL_QUESTIONS]
        replayed: list[Any] = []
        asked = 0
        for messages in questions:
            if len(replayed) >= self.settings.replay:
                break
            asked += 1
            body = {"messages": messages, "temperature": 0, "max_tokens": self.settings.max_tokens}
            completion = context.generate(body)
            cut_allowed = self.settings.replay_cut_answers and not completion.looped
            kept = completion.ended_itself or cut_allowed
            if kept and completion.prompt_token_ids and completion.token_ids:
                ids = list(completion.token_ids)
                replayed.append(TrainingExample(list(completion.prompt_token_ids), ids))
        # Without replay_cut_answers a model that runs past max_tokens replays few.
        log.info("sft: %d replayed answer(s) of %d question(s) asked", len(replayed), asked)
        return replayed

    @staticmethod
    def _tokenized(
        pairs: list[tuple[Turn, list[int] | str]], base: Any
    ) -> Iterator[tuple[Turn, list[int]]]:
        from reef.sdk import encode_completion

        for turn, completion in pairs:
            if isinstance(completion, str):
                yield turn, encode_completion(base.tokenizer, completion)
            else:
                yield turn, completion

    def train(
        self, step: WeightStep, base: Any, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        """The supervised examples (with the replayed answers) with the cross-entropy loss, then
        the hint examples (with the replayed answers as anchors) with the distillation loss, on
        the adapter the first run left; each run's losses go into the step's facts."""
        import dataclasses
        import tempfile

        from reef.sdk import LoraSettings, train_lora

        assert isinstance(step, SFTStep)
        examples, hinted, replayed = step.examples, step.hinted, step.replayed
        trained = None
        if examples:
            settings = LoraSettings(
                rank=self.settings.rank,
                alpha=self.settings.alpha,
                learning_rate=self.settings.learning_rate,
                steps=self.settings.steps,
                batch_size=self.settings.train_batch_size,
                target_modules=self.settings.target_modules,
                seed=self.settings.seed,
                max_length=training_length(self.settings, base),
                processes=self.settings.processes,
                threads=self.settings.threads,
            )
            on_step = self.on_step(context)
            supervised = [*examples, *replayed]
            trained = train_lora(base, supervised, settings, on_step, resume_from)
            step.facts["sft_loss"] = list(trained.losses)
        if not hinted:
            assert trained is not None
            return trained
        with tempfile.TemporaryDirectory(prefix="reef-sft-") as scratch:
            if trained is not None:  # the distillation continues the adapter just trained
                trained.model.save_pretrained(scratch)
                resume_from, trained = Path(scratch), None
            distilled = self._distil(base, hinted, replayed, context, resume_from)
        step.facts["hint_loss"] = list(distilled.losses)
        both = [*step.facts.get("sft_loss", []), *distilled.losses]
        return dataclasses.replace(distilled, losses=both)

    def _distil(
        self,
        base: Any,
        hinted: list[Any],
        replayed: list[Any],
        context: StepContext,
        resume_from: Path | None,
    ) -> Any:
        from reef.sdk import DistillExample

        # A replayed answer is scored under its own prompt by both: the frozen teacher holds it.
        anchors = [DistillExample(e.prompt_ids, e.prompt_ids, e.completion_ids) for e in replayed]
        steps = self.settings.hint_steps or self.settings.steps
        on_step = reporter(context, self.name, "distilling the feedback", steps)
        return distillation(
            self.settings,
            base,
            [*hinted, *anchors],
            on_step,
            resume_from,
            steps=steps,
            divergence=self.settings.hint_divergence,
            teacher="ema",
            teacher_update_rate=self.settings.hint_teacher_update_rate,
            tis_cap=self.settings.hint_tis_cap,
        )
