"""One choice's text as llama.cpp generates it: token pieces decoded to text, stop sequences cut,
and content (or forced tool-call) deltas sent to a stream as they become safe to send."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reef.engines.llamacpp.structured import OutputConstraint, ToolCallText
from reef.protocol import REPETITION, ChunkFactory

Emit = Callable[[dict[str, Any]], None]


@dataclass
class Generation:
    """The state of one choice's generation, filled token by token on the decode thread."""

    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    logprob_content: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # characters of `text` already sent to the client
    logprobs_emitted: int = 0  # entries of `logprob_content` already sent
    finish_reason: str = "length"
    looped: bool = False  # ended because it repeated itself (see repetition.py)
    first_token_at: float | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def add_piece(self, piece: bytes, stops: list[str]) -> bool:
        """Append a token's bytes; True when a stop sequence completed (the text is cut there)."""
        self.text += self.decoder.decode(piece)
        # Only the tail can hold a stop that just completed; search a window that covers it.
        for stop in stops:
            at = self.text.find(stop, max(0, self.emitted - len(stop)))
            if at != -1:
                self.text = self.text[:at]
                self.finish_reason = "stop"
                return True
        return False

    def flush(self) -> None:
        self.text += self.decoder.decode(b"", final=True)


@dataclass
class ChoiceOutput:
    """Where one choice's text goes while it is generated, and the choice it amounts to: content
    deltas, or tool-call deltas when the request forces a tool call."""

    chunks: ChunkFactory
    emit: Emit | None
    index: int
    constraint: OutputConstraint | None
    tool_call: ToolCallText | None = None

    def __post_init__(self) -> None:
        if self.constraint is not None and self.constraint.is_tool_call:
            self.tool_call = ToolCallText(self.constraint.tool_names)
        if self.emit and self.index > 0:  # choice 0's role went out before the request queued
            self.emit(self.chunks.chunk({"role": "assistant", "content": ""}, index=self.index))

    def send(self, state: Generation, hold: int) -> None:
        """Send what is ready, holding back the last `hold` characters (a stop may start there)."""
        if not self.emit:
            return
        if self.tool_call is not None:
            for delta in self.tool_call.deltas(state.text):
                self.emit(self.chunks.chunk({"tool_calls": [delta]}, index=self.index))
            return
        ready = len(state.text) - hold
        if ready > state.emitted:
            fresh = state.logprob_content[state.logprobs_emitted :]
            logprobs = {"content": fresh} if fresh else None
            delta = {"content": state.text[state.emitted : ready]}
            self.emit(self.chunks.chunk(delta, logprobs=logprobs, index=self.index))
            state.emitted = ready
            state.logprobs_emitted = len(state.logprob_content)

    def finish(self, state: Generation) -> None:
        if not self.emit:
            return
        if self.tool_call is not None:
            for delta in self.tool_call.deltas(state.text, final=True):
                self.emit(self.chunks.chunk({"tool_calls": [delta]}, index=self.index))
        else:
            self.send(state, 0)
        self.emit(self.chunks.chunk({}, self.finish_reason(state), index=self.index))

    def finish_reason(self, state: Generation) -> str:
        called = self.tool_call is not None and self.tool_call.name is not None
        return "tool_calls" if called and state.finish_reason == "stop" else state.finish_reason

    def choice(self, state: Generation, logprobs: bool) -> dict[str, Any]:
        message = (
            self.tool_call.message(state.text)
            if self.tool_call is not None
            else {"role": "assistant", "content": state.text}
        )
        choice = {
            "index": self.index,
            "message": message,
            "logprobs": {"content": state.logprob_content} if logprobs else None,
            "finish_reason": self.finish_reason(state),
        }
        if state.looped:  # "stop" to clients; Reef's own readers must not take it as an ending
            choice["reef"] = {"ended_by": REPETITION}
        return choice
