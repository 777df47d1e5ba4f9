"""sft: rejection-sampling fine-tuning of a LoRA adapter, from what users said they wanted.

A step gathers training examples, each a prompt as the engine renders it and a completion:

- **good answers**: turns scored at or above `threshold`, the answer's tokens as served;
- **demonstrations**: feedback `{"demonstration": "..."}` on a turn, the user's own answer;
- **hindsight answers**: a turn scored below `threshold` whose feedback says what was wanted is
  asked again with that feedback beside the user's message (`reef.learning.hindsight`): the
  answers the `scorer` accepts (any, without a scorer) are what the model should have said, and
  it learns to say them to the original prompt, without the hint.

It trains a LoRA on them with `reef.training` (continuing the current release's adapter when the
scenario already serves one), exports it as a PEFT folder and a llama.cpp GGUF adapter, and
proposes it as a `lora` candidate. The worker's gate then compares it with the current release on
the scenario's eval tasks (and the failing prompts, when a scorer is set), on the serving engine.
Training runs in the learning worker, never in the server: serving goes on meanwhile.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.learning.experience import ExperienceView, Trajectory, Turn
from reef.learning.hindsight import demonstrations, hints, relabel
from reef.learning.recipe import (
    Proposal,
    ProposalRefused,
    Recipe,
    RecipeError,
    RecipeSettings,
    StepContext,
)
from reef.releases.chain import read_folder

log = logging.getLogger("reef.learning")
PEFT_CONFIG = "peft/adapter_config.json"


class SFTSettings(RecipeSettings):
    batch_size: int = 4  # learnable turns needed before a step
    threshold: float = 0.5  # a score at or above it is a good answer; below it, a failure
    # Accepts hindsight answers (and scores the failing prompts as extra gate tasks).
    scorer: ScorerSpec | None = None
    hindsight_samples: int = Field(4, ge=1, le=16)
    hindsight_keep: int = Field(2, ge=1, le=16)  # answers kept per failing turn
    max_tokens: int = Field(128, ge=8)  # for hindsight answers
    # The LoRA run (reef.training.LoraSettings): kept as plain settings so that loading the
    # recipe in the server never imports torch.
    rank: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    learning_rate: float = Field(5e-4, gt=0)
    steps: int = Field(40, ge=1)
    train_batch_size: int = Field(4, ge=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    seed: int = 0
    # Torch threads for training. One keeps a step fast on a CPU the server also uses: with two
    # cores shared, torch's threads spin-wait on each other and a step runs about 5x slower.
    threads: int = Field(1, ge=1)


class SFT(Recipe):
    name = "sft"
    signal = "good scores, demonstrations, and feedback that says what was wanted"
    experience = "reactive, from live traffic, relabelled in hindsight"
    target = "model (LoRA)"
    Settings = SFTSettings
    settings: SFTSettings

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self._loaded: Any = None  # the base weights (reef.training.Base), once loaded

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
        if context.generate is None or context.model_path is None or context.work_dir is None:
            raise RecipeError(
                "sft trains the served model's weights: it needs the llama.cpp or vLLM engine "
                "(an upstream engine's weights are remote)"
            )
        if context.files and PEFT_CONFIG not in context.files:
            # Prompts are rendered under the current release, and a LoRA release serves no
            # harness: training under a harness's prompt would teach what is never served.
            raise RecipeError(
                f"{context.release_id} is a harness release and sft proposes LoRA releases: "
                "roll the scenario back to a LoRA or base release, or use harness_evolve"
            )
        from reef.training import TrainingExample

        turns = [turn for t in batch for turn in t.turns]
        pairs = self._completions(turns, context)
        if not pairs:
            raise ProposalRefused("nothing to train on: no good answer, demonstration or hint")
        base = self._base(context)
        prompts: dict[str, list[int]] = {}  # record id -> rendered prompt, once per turn
        examples = [
            TrainingExample(self._prompt_ids(turn, context, prompts), completion)
            for turn, completion in self._tokenized(pairs, base)
        ]
        files, losses = self._train(base, examples, context)
        failing = [turn for turn in turns if self.failing_with_hint(turn)]
        return Proposal(
            kind="lora",
            files=files,
            reason=(
                f"LoRA r{self.settings.rank} on {len(examples)} example(s) from "
                f"{len(turns)} turn(s), {self.settings.steps} steps, loss "
                f"{losses[0]:.3f} -> {losses[-1]:.3f}"
            ),
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            eval_tasks=self._failing_prompts(failing),
            metrics={"loss": losses, "examples": len(examples)},
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
        for item in relabel(
            failing,
            context.generate,
            self.settings.scorer,
            samples=self.settings.hindsight_samples,
            keep=self.settings.hindsight_keep,
            max_tokens=self.settings.max_tokens,
        ):
            pairs.append((item.turn, item.completion_token_ids))
        log.info("sft: %d example(s) from %d turn(s)", len(pairs), len(turns))
        return pairs

    def _prompt_ids(
        self, turn: Turn, context: StepContext, rendered: dict[str, list[int]]
    ) -> list[int]:
        """The turn's prompt as the engine renders it for the candidate: the client's messages
        under the current release (base or LoRA: no harness), asked of the engine once per turn.
        """
        assert context.generate is not None
        if turn.record_id not in rendered:
            completion = context.generate({"messages": turn.messages, "max_tokens": 1})
            if not completion.prompt_token_ids:
                raise RecipeError(
                    "the engine does not report prompt token ids: sft needs llama.cpp"
                )
            rendered[turn.record_id] = list(completion.prompt_token_ids)
        return rendered[turn.record_id]

    def _base(self, context: StepContext):  # type: ignore[no-untyped-def]
        """The base weights, loaded on the first step and kept by the worker's recipe: each
        load hashes the GGUF and checks the tokenizer against llama.cpp."""
        from reef.training import load_base

        assert context.model_path is not None and context.work_dir is not None
        if self._loaded is None or self._loaded.source != context.model_path:
            self._loaded = load_base(
                context.model_path, context.work_dir / "base", progress=log.info
            )
        return self._loaded

    @staticmethod
    def _tokenized(pairs, base):  # type: ignore[no-untyped-def]
        from reef.training import encode_completion

        for turn, completion in pairs:
            if isinstance(completion, str):
                yield turn, encode_completion(base.tokenizer, completion)
            else:
                yield turn, completion

    def _train(self, base, examples, context: StepContext):  # type: ignore[no-untyped-def]
        import torch

        from reef.training import LoraSettings, export_adapter, train_lora

        torch.set_num_threads(self.settings.threads)
        settings = LoraSettings(
            rank=self.settings.rank,
            alpha=self.settings.alpha,
            learning_rate=self.settings.learning_rate,
            steps=self.settings.steps,
            batch_size=self.settings.train_batch_size,
            target_modules=self.settings.target_modules,
            seed=self.settings.seed,
        )
        with tempfile.TemporaryDirectory(prefix="reef-sft-") as scratch:
            current = self._current_adapter(context, Path(scratch) / "current")
            trained = train_lora(
                base,
                examples,
                settings,
                on_step=lambda step, loss: self._report(context, step, loss),
                resume_from=current,
            )
            export_adapter(trained, Path(scratch) / "adapter")
            return read_folder(Path(scratch) / "adapter"), trained.losses

    def _report(self, context: StepContext, step: int, loss: float) -> None:
        log.info("sft: step %d/%d loss %.4f", step, self.settings.steps, loss)
        if context.progress is not None:
            context.progress("training a LoRA", step, self.settings.steps, loss)

    @staticmethod
    def _current_adapter(context: StepContext, folder: Path) -> Path | None:
        """The adapter the scenario serves now, to keep training it (None: start afresh)."""
        if PEFT_CONFIG not in context.files:
            return None
        for path, data in context.files.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder

    def _failing_prompts(self, failing: list[Turn]) -> list[EvalTask]:
        if self.settings.scorer is None:
            return []
        return [
            EvalTask(
                id=f"failing:{turn.record_id}", messages=turn.messages, scorer=self.settings.scorer
            )
            for turn in failing
        ]
