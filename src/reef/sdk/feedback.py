"""What the user said about a turn: the words of their reports (`hints`), the answers they
wrote themselves (`demonstrations`), or, where the conversation went on, their next message
(`next_message`). Recipes learn from these, and the gate judges a candidate on them where no
scorer is set (`reef.sdk.recipe.Recipe.held_out_tasks`)."""

from __future__ import annotations

from typing import Any

from reef.protocol import message_text
from reef.sdk.view import Turn

# How much of a failed episode's test output a hint carries (its end: where tests say why).
TEST_OUTPUT_IN_HINT = 300


def hints(turn: Turn) -> list[str]:
    """The feedback texts that say what was wanted: strings, `{"hint": ...}` or `{"text": ...}`
    objects, and what a failed episode's test said (the report `reef.episodes` writes)."""
    found = []
    for feedback in turn.feedback:
        if isinstance(feedback, dict):
            feedback = feedback.get("hint") or feedback.get("text") or test_verdict(feedback)
        if isinstance(feedback, str) and feedback.strip():
            found.append(feedback.strip())
    return found


def test_verdict(feedback: dict[str, Any]) -> str | None:
    """A failed episode's report as a hint: the test's output is the feedback a task gives."""
    if "episode" not in feedback or feedback.get("passed") or not feedback.get("test_output"):
        return None
    said = " ".join(str(feedback["test_output"]).split())[-TEST_OUTPUT_IN_HINT:]
    return f"The task's test failed and said: {said}"


def demonstrations(turn: Turn) -> list[str]:
    """Answers the user wrote themselves: feedback `{"demonstration": "..."}`."""
    shown = []
    for feedback in turn.feedback:
        if isinstance(feedback, dict) and isinstance(feedback.get("demonstration"), str):
            shown.append(feedback["demonstration"])
    return shown


def next_message(turn: Turn) -> str | None:
    """The user's next message, where the conversation went on ("no, shorter"); None else."""
    for message in turn.next_state or []:
        if message.get("role") == "user":
            return message_text(message.get("content")).strip() or None
    return None


def feedback_of(turn: Turn) -> list[str]:
    """What the user said about the turn: their reports' words, else their next message."""
    said = next_message(turn)
    return hints(turn) or ([said] if said else [])

