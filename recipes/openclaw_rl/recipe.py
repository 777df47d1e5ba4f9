"""openclaw_rl: learning from the conversation itself, as OpenClaw-RL does.

Every turn of a session is followed by a next state: the user's next message or a tool's
result. It says, without anyone scoring anything, whether the answer helped ("no, shorter"
says it did not, and also what was wanted). A step:

1. **judges** each turn that has a next state (`judge.py`): `votes` votes of +1/-1/0, the
   majority (ties 0), and a hint when the next state says what should have been done (the
   longest a vote gives, over 10 characters, whatever the votes' scores). An explicit score from
   `/reef/report` overrides the judge, and its words, if any, are the hint. A session's last turn
   has no next state and is left for later (its session may go on). Each judgement is kept
   beside its record (`reef records` shows it);
2. builds a **token advantage** for each judged answer, as served (its token ids):
   - binary RL: the turn's score on every token, times `w_rl`;
   - hindsight on-policy distillation, when there is a hint: the same answer is scored under
     the prompt with the hint beside the user's message (the teacher) and under the prompt
     alone (the student); each token gets `w_opd * (teacher log-prob - student log-prob)`,
     so the tokens the hint makes less likely are pushed down, the others up;
   - hindsight answers, for a turn judged -1: the served model rewrites its answer as the user's
     words ask (their next message, or the report's words), by `reef.sdk.hindsight.relabel`,
     the path sft's and harness_evolve's report feedback takes; a rewrite it judges to do what
     they ask, that still says what the answer said, is trained on with advantage `w_rl`;
3. **trains** the LoRA with the PPO-style clipped loss (clip 0.2 low, 0.28 high) and a KL
   penalty to the base (β 0.02) of `reef.training.policy`, continuing the scenario's adapter;
4. proposes it as a `lora` candidate; the gate compares it with the current release.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from reef.sdk import (
    LoraRecipeSettings,
    ProposalRefused,
    RecipeError,
    Relabelled,
    StepContext,
    Trajectory,
    Turn,
    WeightRecipe,
    WeightStep,
    current_adapter,
    policy_update,
    relabel,
    rendered_prompt,
    served_prompt,
    training_length,
    with_hint,
)

from .judge import (
    Judge,
    Judgement,
    KeywordJudge,
    ModelJudge,
    endpoint_ask,
    judge_turn,
)

if TYPE_CHECKING:
    from reef.sdk import TrainedAdapter

log = logging.getLogger("reef.learning")


class OpenClawRLSettings(LoraRecipeSettings):
    batch_size: int = 4  # judgeable turns (a next state or a score) needed before a step
    judge: Literal["model", "keywords"] = "model"
    # The judge model: an OpenAI-compatible endpoint, or the served model when unset.
    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str | None = None  # the variable holding the judge's key, never the key
    votes: int = Field(3, ge=1, le=15)
    w_rl: float = Field(1.0, ge=0.0)  # weight of binary RL's advantage
    w_opd: float = Field(1.0, ge=0.0)  # weight of hindsight distillation's advantage
    # Rewrites of an answer judged -1 asked of the served model under the user's words (0: none).
    revisions: int = Field(2, ge=0, le=8)
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.28, ge=0.0)
    kl_beta: float = Field(0.02, ge=0.0)
    # The cap of the importance weight that corrects for the engine having sampled the answers
    # (quantised, top-k, min-p), not the weights trained here; none: no correction.
    tis_cap: float | None = Field(2.0, gt=0.0)
    # The LoRA run's other settings come from LoraRecipeSettings.
    learning_rate: float = Field(2e-4, gt=0)
    steps: int = Field(8, ge=1)  # gradient steps on the batch


def served_logprobs(turn: Turn, tokens: int) -> list[float] | None:
    """The log-probs the engine sampled the answer's first `tokens` tokens with, if recorded."""
    served = turn.completion_logprobs
    if not served or len(served) != len(turn.completion_token_ids or []):
        return None
    return list(served[:tokens])


def token_advantages(
    score: float,
    tokens: int,
    settings: OpenClawRLSettings,
    teacher: list[float] | None = None,
    student: list[float] | None = None,
) -> list[float]:
    """Each token's advantage: w_rl * score, plus w_opd * (teacher - student) where the answer
    was scored under the hint (the teacher) and without it (the student)."""
    advantages = [settings.w_rl * score] * tokens
    if teacher is None or student is None:
        return advantages
    return [
        a + settings.w_opd * (t - s) for a, t, s in zip(advantages, teacher, student, strict=True)
    ]


class OpenClawRL(WeightRecipe):
    name = "openclaw_rl"
    signal = "the next state of each turn: the user's reply or the tool's result"
    reads_feedback_text = True
    experience = "reactive, from live multi-turn sessions, judged turn by turn"
    Settings = OpenClawRLSettings
    settings: OpenClawRLSettings
    training = "training a LoRA (policy)"

    # -- what can be learned from ----------------------------------------------------------------

    def learnable(self, turn: Turn) -> bool:
        """A turn the step can judge: scored by the user, or followed by a next state. Its
        answer's token ids must have been recorded (the llama.cpp and vLLM engines do)."""
        has_signal = turn.score is not None or bool(turn.next_state)
        return has_signal and bool(turn.completion_token_ids)

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        turns = [turn for t in batch for turn in t.turns if self.learnable(turn)]
        judged = self._judged(turns, context)
        if not any(j.score != 0 or j.hint for _, j in judged):
            raise ProposalRefused(
                f"the judge found nothing to learn in {len(judged)} turn(s): every score 0"
            )
        examples, opd_turns = self._examples(judged, context)
        scores = [j.score for _, j in judged]
        return WeightStep(
            examples,
            # A session's last turn is not consumed: when the session goes on, it gets its
            # next state and is judged then.
            consumed=[turn.record_id for turn, _ in judged],
            facts={
                "judged": len(judged),
                "scores": {str(s): scores.count(s) for s in sorted(set(scores))},
                "score_mean": sum(scores) / len(scores),
                "hints": opd_turns,
            },
        )

    def summary(self, step: WeightStep) -> str:
        facts = step.facts
        return (
            f"binary RL on {facts['judged']} judged turn(s) (mean score "
            f"{facts['score_mean']:+.2f}), hindsight distillation on {facts['hints']}"
        )

    def train(
        self, step: WeightStep, base: Any, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        on_step = self.on_step(context)
        return policy_update(self.settings, base, step.examples, on_step, resume_from)

    def _judge(self, context: StepContext) -> Judge:
        if self.settings.judge == "keywords":
            return KeywordJudge()
        if self.settings.judge_url:
            ask = endpoint_ask(
                self.settings.judge_url, self.settings.judge_model, self.settings.judge_api_key_env
            )
            return ModelJudge(ask, self.settings.votes)
        if context.ask is None:
            raise RecipeError("openclaw_rl's model judge needs the served model or a judge_url")
        return ModelJudge(context.ask, self.settings.votes)

    def _judged(self, turns: list[Turn], context: StepContext) -> list[tuple[Turn, Judgement]]:
        """Each turn with its judgement, kept beside its record as it is made."""
        judge = self._judge(context)
        judged = []
        for index, turn in enumerate(turns, start=1):
            judgement = judge_turn(turn, judge)
            if judgement is None:
                continue
            if context.annotate is not None:
                context.annotate(turn.record_id, judgement.as_dict())
            if context.progress is not None:
                context.progress("judging turns", index, len(turns), None)
            judged.append((turn, judgement))
        log.info("openclaw_rl: judged %d turn(s)", len(judged))
        return judged

    def _examples(
        self, judged: list[tuple[Turn, Judgement]], context: StepContext
    ) -> tuple[list[Any], int]:
        """A policy example per judged answer, and how many got a distillation term."""
        from reef.sdk import (
            PolicyExample,
            TrainingExample,
            completion_logprobs,
            encode_completion,
            fit,
        )

        base = self.base(context)
        model = self._policy_now(base, context)
        length = training_length(self.settings, base)
        prompts: dict[str, list[int]] = {}
        examples = []
        distilled = 0
        for item in self.hindsight_answers(judged, context):
            prompt = served_prompt(context, item.turn, prompts)
            completion = encode_completion(base.tokenizer, item.answer)
            prompt, completion = fit(TrainingExample(prompt, completion), length)
            examples.append(
                PolicyExample(prompt, completion, [self.settings.w_rl] * len(completion))
            )
        for turn, judgement in judged:
            # The prompt as served and its answer, cut as the update will cut them: teacher and
            # student below score exactly the context the update trains on.
            answer = list(turn.completion_token_ids or [])
            served = TrainingExample(served_prompt(context, turn, prompts), answer)
            prompt, completion = fit(served, length)
            teacher = student = None
            if judgement.hint and self.settings.w_opd > 0:
                hinted = with_hint(turn.messages, judgement.hint)
                teacher_prompt = rendered_prompt(
                    context, hinted, prompts, f"{turn.record_id}+", tools=turn.tools
                )
                teacher_prompt, _ = fit(TrainingExample(teacher_prompt, completion), length)
                teacher = completion_logprobs(model, teacher_prompt, completion)
                student = completion_logprobs(model, prompt, completion)
                distilled += 1
            advantages = token_advantages(
                judgement.score, len(completion), self.settings, teacher, student
            )
            behaviour = served_logprobs(turn, len(completion))
            examples.append(PolicyExample(prompt, completion, advantages, None, behaviour))
        return examples, distilled

    def hindsight_answers(
        self, judged: list[tuple[Turn, Judgement]], context: StepContext
    ) -> list[Relabelled]:
        """For each turn judged -1, a rewrite of its answer by the served model that does what
        the user's words ask, if one does (`relabel`, judged by the same model)."""
        wanting = [turn for turn, judgement in judged if judgement.score < 0]
        if not wanting or not self.settings.revisions or context.generate is None:
            return []
        found = relabel(
            wanting,
            context.generate,
            None,
            samples=0,
            keep=1,
            revisions=self.settings.revisions,
            dropped=context.dropped,
        )
        log.info("openclaw_rl: %d hindsight answer(s) for %d turn(s)", len(found), len(wanting))
        return found

    def _policy_now(self, base: Any, context: StepContext) -> Any:
        """The model as the scenario serves it now (the base with its current adapter)."""
        from reef.sdk import load_lora

        with tempfile.TemporaryDirectory(prefix="reef-openclaw-") as scratch:
            folder = current_adapter(context, Path(scratch))
            return load_lora(base, folder).eval() if folder is not None else base.model
