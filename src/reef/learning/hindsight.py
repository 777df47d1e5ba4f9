"""Hindsight relabelling: what the model would have answered had it known what the user wanted.

A turn the user scored low, with feedback text, is asked again with that feedback put next to the
user's message (small models follow text there far better than in a system prompt), and several
answers are sampled. Before sampling, where the recipe has a scorer to confirm them, the first
answer itself is edited as feedback often asks (`edits`: the text the feedback quotes put before
or after it, the answer cut to its first sentence, the answer as a bullet point): a model too
small to follow the hint still said something worth keeping. An answer is kept when the
recipe's scorer accepts it (any, without a scorer) *and* it still answers the question: beyond
the feedback's own words, it says something, and mostly what the question or the first answer
said (`evaluation.content.grounded`). "Sure!" alone meets "start with Sure" and says nothing;
"Sure! Paris." keeps the answer. Kept answers are the training signal: a LoRA learns to give
them without the hint (`sft`), or a harness shows them as worked examples (`harness_evolve`).
No preference is coded here: the scorer decides which answers meet the feedback. (A correction
whose whole content is in the feedback, "No: 9", is better given as a demonstration.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from reef.evaluation.content import content_words, grounded
from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.learning.view import Turn
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
    completion_token_ids: list[int]  # as the model produced them, ending with its end token;
    # empty for an edit of the first answer (`edits`): train on `answer`'s text


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


# Text the feedback asks for word for word: 'quoted' (an apostrophe inside a word, as in
# "don't", opens no quote), "quoted", or what follows a colon after a word naming a text ("end
# with the line: Cheers"; "Too long: reply briefly" is an instruction, not a text to add).
_QUOTED = re.compile(r"(?<!\w)'([^']{1,80})'(?!\w)|\"([^\"]{1,80})\"|\u201c([^\u201d]{1,80})\u201d")
_NAMES_A_TEXT = re.compile(
    r"\b(line|lines|word|words|phrase|text|sentence|greeting|signature|sign-off)\s*:\s*(.+)$",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def asked_for(hint: str) -> list[str]:
    """The texts `hint` asks to appear as they are: "Start with 'Sure!'" -> Sure!; "End with
    the line: Cheers, Reef" -> Cheers, Reef."""
    texts = [next(group for group in match.groups() if group) for match in _QUOTED.finditer(hint)]
    named = _NAMES_A_TEXT.search(hint)
    if named and len(named.group(2).strip()) <= 80:
        texts.append(named.group(2).strip())
    return list(dict.fromkeys(text.strip() for text in texts if text.strip()))


def edits(answer: str, hint: str) -> list[str]:
    """The first answer edited as feedback often asks, with no model: the answer or its first
    sentence, with each text the hint quotes before or after it, alone, or as a bullet point.
    Where the hint asks for several texts ("Start with 'Sure!' End with the line: Cheers"), one
    before and another after come first: the edit that honours all of it. Guesses: only a
    scorer can say which (if any) meets the feedback."""
    answer = answer.strip()
    if not answer:
        return []
    first = _SENTENCE_END.split(answer, maxsplit=1)[0]
    texts = asked_for(hint)
    edited = []
    for body in dict.fromkeys([answer, first]):
        edited += [f"{before} {body}\n\n{after}" for before, after in permutations(texts, 2)]
    for body in dict.fromkeys([answer, first]):
        edited += [f"{text} {body}" for text in texts]
        edited += [f"{body}\n\n{text}" for text in texts]
        edited += [body, f"- {body}"]
    return [text for text in dict.fromkeys(edited) if text != answer]


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
    """Up to `keep` distinct answers per turn that meet `scorer` and still answer the question:
    edits of the first answer (with a scorer), then answers sampled under the hint, `samples` at
    most. The first sample is greedy (temperature 0): often the best a small model gives."""
    kept: list[Relabelled] = []
    for turn in turns:
        for hint in hints(turn)[:1]:
            hinted = with_hint(turn.messages, hint)
            answers: set[str] = set()
            for answer in edits(turn.answer_text, hint) if scorer is not None else []:
                if len(answers) >= keep:
                    break
                if meets(scorer, answer, turn.messages) and answers_the_question(
                    answer, turn, hint
                ):
                    answers.add(answer)
                    kept.append(Relabelled(turn, hint, answer, []))
            for sample in range(samples if len(answers) < keep else 0):
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
