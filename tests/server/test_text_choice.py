"""A legacy text completion is built from the chat completion: its choice keeps Reef's own mark
of why the engine ended the answer, so a record of it tells a learner that the answer looped."""

from __future__ import annotations

from reef.server.completions.text import text_completion


def test_the_text_choice_keeps_why_the_engine_ended_the_answer() -> None:
    chat = {
        "index": 0,
        "message": {"role": "assistant", "content": " sea sea sea"},
        "finish_reason": "stop",
        "reef": {"ended_by": "repetition"},
    }
    response = {"id": "chatcmpl-1", "model": "m", "choices": [chat]}
    (text,) = text_completion(response, "The", echo=True)["choices"]
    assert text["text"] == "The sea sea sea" and text["finish_reason"] == "stop"
    assert text["reef"] == {"ended_by": "repetition"}
    del chat["reef"]
    assert "reef" not in text_completion(response, "The", echo=True)["choices"][0]
