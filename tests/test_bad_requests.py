"""A corpus of bad requests against the real server: each a 4xx in OpenAI's error shape whose
message names what to fix, none stored, and the server serves a normal request afterwards."""

from __future__ import annotations

import pytest

from reef.engines.base import ChatMessage, message_text
from reef.errors import BadRequest

# -- the one function that reads a message's text --------------------------------------------


def test_message_text_joins_text_parts_and_skips_or_refuses_the_rest() -> None:
    parts = [
        {"type": "text", "text": "Read"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "input_text", "text": "x.py"},
    ]
    assert message_text("plain") == "plain"
    assert message_text(None) == ""
    assert message_text(parts) == "Read\nx.py"
    with pytest.raises(BadRequest, match="image_url"):
        message_text(parts, only_text=True)
    assert ChatMessage(role="user", content=parts[::2]).text() == "Read\nx.py"
