"""A scripted model's answer, for recipe tests whose model is a function of the request."""

from __future__ import annotations

from reef.protocol import Completion


def said(text: str) -> Completion:
    """A whole chat completion whose one choice says `text`."""
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return Completion({"id": "c", "object": "chat.completion", "choices": [choice]}, "scripted")
