"""Hindsight relabelling: what the model would have answered had it known what the user wanted.

A turn the user scored low, with feedback text, is asked again with that feedback put next to the
user's message (small models follow text there far better than in a system prompt). Several
answers are sampled; an answer is kept when the recipe's scorer accepts it (any, without a
scorer) *and* it still answers the question: beyond the feedback's own words, it says something,
and mostly what the question or the first answer said (`evaluation.content.grounded`). "Sure!"
alone meets "start with Sure" and says nothing; "Sure! Paris." keeps the answer. Kept answers
are the training signal: a LoRA learns to give them without the hint (`sft`), or a harness shows
them as worked examples (`harness_evolve`). Nothing here reads the feedback's wording: any
preference the model can follow once told is learned the same way. (A correction whose whole
content is in the feedback, "No: 9", is better given as a demonstration.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reef.evaluation.content import content_words, grounded
from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.learning.experience import Turn
from reef.protocol import Completion, message_text

# Runs an OpenAI chat request body on the model under the scenario's current release, unrecorded.
Generate = Callable[[dict[str, Any]], Completion]
HINT_TEMPLATE = "{message} {hint}"  # right after the request: where small models listen


@dataclass
class Relabelled:
    """An answer given under the hint that meets it, for the turn's original messages."""

    turn: Turn
    hint: str
    answer: str
    completion_token_ids: list[int]  # as the model produced them, ending with its end token


def hints(turn: Turn) -> list[str]:
    """The feedback texts that say what was wanted: strings, or `{"hint": ...}` objects."""
    found = []
    for feedback in turn.feedback:
        if isinstance(feedback, dict):
            feedback = feedback.get("hint") or feedback.get("text")
        if isinstance(feedback, str) and feedback.strip():
            found.append(feedback.strip())
    return found


def demonstrations(turn: Turn) -> list[str]:
    """Answers the user wrote themselves: feedback `{"demonstration": "..."}`."""
    shown = []
    for feedback in turn.feedback:
        if isinstance(feedback, dict) and isinstance(feedback.get("demonstration"), str):
            shown.append(feedback["demonstration"])
    return shown


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The messages with `hint` appended to the last user message."""
    hinted = [dict(m) for m in messages]
    for message in reversed(hinted):
        if message.get("role") == "user":
            text = message_text(message.get("content"))
            message["content"] = HINT_TEMPLATE.format(message=text, hint=hint)
            return hinted
    return [*hinted, {"role": "user", "content": hint}]


# Of an answer's content words beyond the feedback's, the share the question or the first answer
# must have said.
GROUNDED = 0.5


def answers_the_question(answer: str, turn: Turn, hint: str) -> bool:
    """Whether a hindsight answer still answers: it says something beyond the feedback's words,
    and mostly what the question or the original answer said."""
    feedback = content_words(hint)
    own = " ".join(sorted(content_words(answer) - feedback))
    return grounded(own, [turn.prompt, turn.answer_text]) >= GROUNDED


def meets(scorer: ScorerSpec | None, answer: str, messages: list[dict[str, Any]]) -> bool:
    if scorer is None:
        return bool(answer.strip())
    task = EvalTask(id="hindsight", messages=messages, scorer=scorer)
    return score(scorer, answer, task) >= 0.5


def relabel(
    turns: list[Turn],
    generate: Generate,
    scorer: ScorerSpec | None,
    samples: int = 4,
    keep: int = 2,
    temperature: float = 0.8,
    max_tokens: int = 128,
) -> list[Relabelled]:
    """Up to `keep` distinct answers per turn, out of `samples` sampled under its hint, that meet
    `scorer` and still answer the question. The first sample is greedy (temperature 0): often
    the best a small model gives."""
    kept: list[Relabelled] = []
    for turn in turns:
        for hint in hints(turn)[:1]:
            hinted = with_hint(turn.messages, hint)
            answers: set[str] = set()
            for sample in range(samples):
                completion = generate(
                    {
                        "messages": hinted,
                        "temperature": 0.0 if sample == 0 else temperature,
                        "seed": sample,
                        "max_tokens": max_tokens,
                    }
                )
                choice = completion.response["choices"][0]
                answer = str(choice["message"].get("content") or "")
                cut_short = choice.get("finish_reason") != "stop"
                if cut_short or answer in answers or not meets(scorer, answer, turn.messages):
                    continue
                if not answers_the_question(answer, turn, hint):
                    continue
                answers.add(answer)
                kept.append(Relabelled(turn, hint, answer, list(completion.token_ids or [])))
                if len(answers) >= keep:
                    break
    return kept
