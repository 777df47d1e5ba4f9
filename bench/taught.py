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
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reef.protocol import message_text
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


@contextmanager
def taught_model(table: Table) -> Iterator[str]:
    """The stand-in, served on loopback; yields its base URL (ending in /v1)."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        said = "\n".join(message_text(m.get("content")) for m in body.get("messages", []))
        answer = table.answer(said) if table.answering else None
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
