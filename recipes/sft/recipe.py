"""sft: rejection-sampling fine-tuning of a LoRA adapter, from what users said they wanted.

A step gathers training examples, each a prompt as the engine renders it and a completion:

- **good answers**: turns scored at or above `threshold`, the prompt and the answer's tokens as
  served (a record without its prompt's tokens is rendered again, with its call's tools);
- **demonstrations**: feedback `{"demonstration": "..."}` on a turn, the user's own answer;
- **hindsight answers**: for a turn scored below `threshold` whose feedback says what was wanted,
  the served model rewrites its answer as the feedback asks, and is asked again with that
  feedback beside the user's message (`reef.learning.hindsight`): the answers the `scorer`
  accepts (the model as judge, without a scorer) that still answer the question are what the
  model should have said, and it learns to say them to the original prompt, without the hint.

Beside them it replays what the agent already does elsewhere, so that learning one thing does
not cost it the rest: the current release's own greedy answers to `replay` other questions (the
scenario's latest calls outside the batch, else a few general questions) join the examples.

It trains a LoRA on them with `reef.training` (continuing the current release's adapter when the
scenario already serves one), on prompts as they were served, exports
it as a PEFT folder and a llama.cpp GGUF adapter, and proposes it as a `lora` candidate: the worker
keeps the serving harness beside it (an `agent` release when there is one). The worker's gate then
compares it with the current release on the scenario's eval tasks (and the failing prompts, when a
scorer is set), on the serving engine. Training runs in the learning worker, never in the server:
serving goes on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from reef.sdk import (
    BaseWeights,
    ExperienceView,
    LoraRecipeSettings,
    Proposal,
    ProposalRefused,
    Recipe,
    RecipeSettings,
    ScorerSpec,
    StepContext,
    Trajectory,
    Turn,
    asking,
    demonstrations,
    failing_prompts,
    hints,
    proposal_kind,
    relabel,
    reporter,
    require_weights,
    served_prompt,
    train_on_current,
    training_length,
)

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
    # Accepts hindsight answers (and scores the failing prompts as extra gate tasks).
    scorer: ScorerSpec | None = None
    hindsight_samples: int = Field(4, ge=1, le=16)
    hindsight_keep: int = Field(2, ge=1, le=16)  # answers kept per failing turn
    # Rewrites of a failing answer asked under its feedback (0: none), of the served model or of
    # the proposer model (learning.proposer_*: a stronger one, where configured).
    hindsight_revisions: int = Field(2, ge=0, le=16)
    reviser: Literal["served", "proposer"] = "served"
    max_tokens: int = Field(128, ge=8)  # for hindsight and replayed answers
    train_batch_size: int = Field(4, ge=1)  # examples per LoRA step (see LoraRecipeSettings)
    # Other questions whose current answers are trained on beside the new examples, so the
    # model keeps answering as it did (0: none).
    replay: int = Field(4, ge=0)


class SFT(Recipe):
    name = "sft"
    trains_weights = True
    signal = "good scores, demonstrations, and feedback that says what was wanted"
    experience = "reactive, from live traffic, relabelled in hindsight"
    target = "model (LoRA)"
    Settings = SFTSettings
    settings: SFTSettings

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self._base = BaseWeights()

    # -- what can be learned from ----------------------------------------------------------------

    def good(self, turn: Turn) -> bool:
        return turn.score is not None and turn.score >= self.settings.threshold

    def failing_with_hint(self, turn: Turn) -> bool:
        failing = turn.score is None or turn.score < self.settings.threshold
        return failing and bool(hints(turn))

    def learnable(self, turn: Turn) -> bool:
        return self.good(turn) or bool(demonstrations(turn)) or self.failing_with_hint(turn)

    def ready(self, view: ExperienceView) -> bool:
        turns = [turn for t in view.trajectories for turn in t.turns]
        return sum(self.learnable(turn) for turn in turns) >= self.settings.batch_size

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        batch: list[Trajectory] = []
        count = 0
        for trajectory in view.trajectories:
            learnable = sum(self.learnable(turn) for turn in trajectory.turns)
            if learnable:
                batch.append(trajectory)
                count += learnable
            if count >= self.settings.batch_size:
                break
        return batch

    # -- a step ---------------------------------------------------------------------------------

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        require_weights(context, self.name)
        from reef.sdk import TrainingExample

        turns = [turn for t in batch for turn in t.turns]
        pairs = self._completions(turns, context)
        if not pairs:
            raise ProposalRefused("nothing to train on: no good answer, demonstration or hint")
        base = self._base.get(context)
        prompts: dict[str, list[int]] = {}  # record id -> rendered prompt, once per turn
        examples = [
            TrainingExample(served_prompt(context, turn, prompts), completion)
            for turn, completion in self._tokenized(pairs, base)
        ]
        learned = len(examples)
        examples += self._replayed(context, {tuple(map(str, t.messages)) for t in turns})
        files, trained = train_on_current(
            context,
            lambda resume_from: self._train(base, examples, context, resume_from),
            merge_into=base if self.settings.checkpoint else None,
        )
        losses = trained.losses
        failing = [turn for turn in turns if self.failing_with_hint(turn)]
        return Proposal(
            kind=proposal_kind(self.settings),
            files=files,
            reason=(
                f"LoRA r{self.settings.rank} on {learned} example(s) from {len(turns)} "
                f"turn(s) and {len(examples) - learned} replayed, {self.settings.steps} steps, "
                f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
            ),
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            eval_tasks=failing_prompts(failing, self.settings.scorer),
            metrics={"loss": losses, "examples": learned, "replayed": len(examples) - learned},
        )

    def _completions(
        self, turns: list[Turn], context: StepContext
    ) -> list[tuple[Turn, list[int] | str]]:
        """What each turn should have answered: token ids as served, or a text to tokenize."""
        assert context.generate is not None
        pairs: list[tuple[Turn, list[int] | str]] = []
        for turn in turns:
            if self.good(turn) and turn.completion_token_ids:
                pairs.append((turn, list(turn.completion_token_ids)))
            pairs.extend((turn, text) for text in demonstrations(turn))
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
        ):
            pairs.append((item.turn, item.completion_token_ids or item.answer))
        log.info("sft: %d example(s) from %d turn(s)", len(pairs), len(turns))
        return pairs

    def _replayed(self, context: StepContext, learned: set[tuple[str, ...]]) -> list[Any]:
        """The current release's finished greedy answers to `replay` questions outside what is
        learned from, as training examples (prompt and answer token ids as served)."""
        from reef.sdk import TrainingExample

        assert context.generate is not None
        questions = [m for m in context.anchors if tuple(map(str, m)) not in learned]
        questions += [[{"role": "user", "content": q}] for q in GENERAL_QUESTIONS]
        replayed = []
        for messages in questions:
            if len(replayed) >= self.settings.replay:
                break
            body = {"messages": messages, "temperature": 0, "max_tokens": self.settings.max_tokens}
            completion = context.generate(body)
            finished = completion.response["choices"][0].get("finish_reason") == "stop"
            if finished and completion.prompt_token_ids and completion.token_ids:
                ids = list(completion.token_ids)
                replayed.append(TrainingExample(list(completion.prompt_token_ids), ids))
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

    def _train(
        self, base: Any, examples: list[Any], context: StepContext, resume_from: Path | None
    ) -> Any:
        import torch

        from reef.sdk import LoraSettings, train_lora

        torch.set_num_threads(self.settings.threads)
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
        )
        on_step = reporter(context, self.name, "training a LoRA", self.settings.steps)
        return train_lora(base, examples, settings, on_step=on_step, resume_from=resume_from)
