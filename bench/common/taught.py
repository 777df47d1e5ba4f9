"""A stand-in for a capable model, for the preferences the embedded 135M model cannot follow.

On this machine the only model is the embedded SmolLM2-135M, which does not answer in French or
in five words when told to. The paths Reef offers for such preferences need a model that can:
the scenario's `teacher:` upstream, a stronger reviser (`learning.proposer_url` with `sft`'s
`reviser: proposer`), or the user's own demonstrations. This module is that model for the
bench: a loopback OpenAI-compatible server that answers each training prompt from a table written
here, as a capable model that understood the user would. It never reads the feedback: it finds
which training prompt a request is about and answers it the preferred way. So the bench measures
Reef's path (recording, relabelling, training, the gate), not a teacher's understanding. Where a
GPU is lent, a larger instruct model served by vLLM takes its place.

Asked hindsight's content question (`CONTENT_PROMPT`: does this answer answer the question, in
whatever language?), it judges by its tables, as a model that reads both languages would: yes
when most of the answer's content words are in the question or in one of its answers to that
question, in any preference's table (so "Le ciel est bleu." answers "What colour is the sky?",
and "La fer de la fer." answers nothing).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reef.evaluation.content import grounded
from reef.protocol import message_text
from reef.sdk.hindsight import CONTENT_PROMPT
from reef.testing.threaded import chat_upstream

# Each training prompt (reef.testing.scripted_user.TRAINING) answered each preferred way. The
# answers repeat the question's words: a revision must still answer what was asked.
TAUGHT: dict[str, dict[str, str]] = {
    "sure": {
        "What is the capital of France?": "Sure! The capital of France is Paris.",
        "Name an animal.": "Sure! An animal: the horse.",
        "What is 2+2?": "Sure! 2+2 is 4.",
        "What colour is the sky?": "Sure! The sky is blue.",
        "Name a fruit.": "Sure! A fruit: the apple.",
        "What is the largest ocean?": "Sure! The largest ocean is the Pacific.",
    },
    "short": {
        "What is the capital of France?": "Paris.",
        "Name an animal.": "A horse.",
        "What is 2+2?": "Four.",
        "What colour is the sky?": "Blue.",
        "Name a fruit.": "An apple.",
        "What is the largest ocean?": "The Pacific.",
    },
    "french": {
        "What is the capital of France?": "La capitale de la France est Paris.",
        "Name an animal.": "Le cheval est un animal.",
        "What is 2+2?": "Deux et deux font quatre.",
        "What colour is the sky?": "Le ciel est bleu.",
        "Name a fruit.": "La pomme est un fruit.",
        "What is the largest ocean?": "Le plus grand océan est le Pacifique.",
    },
}


@dataclass
class Table:
    """What the stand-in answers now: the preference it teaches, and whether it answers at all
    (off while the bench measures the student: a teacher that cannot answer leaves the student's
    answer in place)."""

    preference: str = "sure"
    answering: bool = True

    def answer(self, text: str) -> str | None:
        """The preferred answer to the training prompt `text` is about, or None."""
        table = TAUGHT.get(self.preference, {})
        return next((answer for prompt, answer in table.items() if prompt in text), None)


# hindsight's content question, its two fields read back.
_CONTENT_QUESTION = re.compile(
    re.escape(CONTENT_PROMPT)
    .replace(re.escape("{question}"), "(?P<question>.*)")
    .replace(re.escape("{answer}"), "(?P<answer>.*)"),
    re.DOTALL,
)


def judged(text: str) -> str | None:
    """The stand-in's reply to hindsight's content question in `text`, or None for any other
    request: "Yes." when most of the answer's content words are in the question or in one of
    the tables' answers to it (any preference, so any language the tables speak)."""
    asked = _CONTENT_QUESTION.fullmatch(text)
    if asked is None:
        return None
    question, answer = asked.group("question"), asked.group("answer")
    known = [question] + [
        by_prompt[question] for by_prompt in TAUGHT.values() if question in by_prompt
    ]
    return "Yes." if grounded(answer, known) >= 0.5 else "No."


@contextmanager
def taught_model(table: Table) -> Iterator[str]:
    """The stand-in, served on loopback; yields its base URL (ending in /v1)."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        said = "\n".join(message_text(m.get("content")) for m in body.get("messages", []))
        answer = (judged(said) or table.answer(said)) if table.answering else None
        if answer is None:
            return JSONResponse({"error": {"message": "not a training prompt"}}, status_code=503)
        return JSONResponse(completion(answer))

    with chat_upstream(completions, "taught", "the taught model") as url:
        yield url


def completion(text: str) -> dict:
    return {
        "id": "chatcmpl-taught",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "taught",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
    }
