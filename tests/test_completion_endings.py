"""How a learner reads the way an answer ended (`Completion.looped`, `Completion.ended_itself`),
whatever engine or upstream built the response."""

from __future__ import annotations

from typing import Any

from reef.protocol import Completion


def ended(choice: Any) -> Completion:
    return Completion(response={"choices": [choice]}, model="m")


def test_only_a_stop_the_engine_did_not_make_for_a_loop_is_a_whole_answer() -> None:
    assert ended({"finish_reason": "stop"}).ended_itself
    looped = ended({"finish_reason": "stop", "reef": {"ended_by": "repetition"}})
    assert looped.looped and not looped.ended_itself
    assert not ended({"finish_reason": "length"}).ended_itself
    assert not ended({"finish_reason": "tool_calls"}).ended_itself


def test_a_foreign_or_empty_response_is_read_without_error() -> None:
    assert not ended({"finish_reason": "stop", "reef": "looped"}).looped
    assert ended({"finish_reason": "stop", "reef": "looped"}).ended_itself
    for response in ({}, {"choices": []}, {"choices": None}, {"choices": ["text"]}):
        completion = Completion(response=response, model="m")
        assert not completion.looped and not completion.ended_itself
