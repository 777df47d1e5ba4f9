"""A scripted model's answer, for recipe tests whose model is a function of the request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reef.protocol import Completion


def said(text: str) -> Completion:
    """A whole chat completion whose one choice says `text`."""
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return Completion({"id": "c", "object": "chat.completion", "choices": [choice]}, "scripted")


def ask_of(model: Callable[[dict[str, Any]], Completion]) -> Callable[..., str]:
    """A `StepContext.ask` (the proposer model) over a scripted `model`: the request it builds
    from the arguments, and the text of the model's answer."""

    def ask(
        messages: list[dict],
        json_schema: dict | None = None,
        max_tokens: int = 400,
        temperature: float = 0.7,
    ) -> str:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        return str(model(body).response["choices"][0]["message"]["content"])

    return ask


# A recipe that proposes a harness naming the first record it learned from (its source, for a
# project's recipe file).
ECHO_RECIPE = """
from reef.sdk import Proposal, Recipe


class Echo(Recipe):
    name = "echo"

    def propose(self, batch, context):
        consumed = [record for trajectory in batch for record in trajectory.record_ids]
        text = f"Learned from {consumed[0]}.\\n".encode()
        return Proposal("harness", {"AGENTS.md": text}, self.name, consumed)
"""
