"""Hindsight relabelling's pieces that need no model: hints, demonstrations, the hinted prompt."""

from __future__ import annotations

from reef.evaluation.tasks import ScorerSpec
from reef.learning.experience import Turn
from reef.learning.hindsight import demonstrations, hints, meets, with_hint


def turn(*feedback: object) -> Turn:
    reports = [{"score": 0.0, "feedback": f} for f in feedback]
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Name a fruit."},
    ]
    return Turn("r1", messages, {"role": "assistant", "content": "A pear."}, "base", reports)


def test_hints_are_feedback_texts_and_hint_objects_not_demonstrations() -> None:
    found = turn("Shorter, please.", {"hint": "Use one word."}, {"demonstration": "Apple."}, "  ")
    assert hints(found) == ["Shorter, please.", "Use one word."]
    assert demonstrations(found) == ["Apple."]


def test_the_hint_follows_the_last_user_message_and_nothing_else_changes() -> None:
    original = turn("x").messages
    hinted = with_hint(original, "Use one word.")
    assert hinted[0] == original[0]
    assert hinted[1] == {"role": "user", "content": "Name a fruit. Use one word."}
    assert original[1]["content"] == "Name a fruit."  # the turn's own messages are untouched
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]
    assert with_hint(parts, "Be brief.")[0]["content"] == "Name a fruit. Be brief."


def test_without_a_scorer_any_non_empty_answer_meets_the_hint() -> None:
    messages = turn().messages
    assert meets(None, "Apple.", messages) and not meets(None, "  ", messages)
    sure = ScorerSpec(type="regex", pattern=r"^\W*Sure")
    assert meets(sure, "Sure! Apple.", messages) and not meets(sure, "Apple.", messages)
