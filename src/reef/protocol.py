"""The OpenAI chat protocol Reef speaks on every floor: the request and its messages, the
completion an engine returns, the chunks of a stream and how they add up to a completion.

The server's API rooms translate their own wire shapes (Anthropic messages, the Responses API,
text completions) to and from these; engines take a `ChatRequest` and return a `Completion`;
the store, evaluation and learning read them. Nothing here imports the rest of Reef but its
errors.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from reef.errors import BadRequest

TEXT_PART_TYPES = ("text", "input_text")
# OpenAI sends logit_bias keys as token ids written in digits, as JSON object keys must be strings.
TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")  # matched whole (`.fullmatch`): no trailing newline
MAX_LOGIT_BIAS = 100
# Choices per request (`n`): llama.cpp generates them one after another, holding its one worker.
MAX_CHOICES = 8


def message_text(content: Any, *, only_text: bool = False) -> str:
    """A message's text: a string as is; of an array of parts, its text parts joined with newlines.

    Other parts (images, audio) are skipped, or refused with `only_text`: an engine that cannot
    see them must not answer as if they were not there.
    """
    if content is None:
        return ""
    if not isinstance(content, list):
        return str(content)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PART_TYPES:
            texts.append(str(part.get("text", "")))
        elif only_text:
            raise BadRequest(
                f"message content part of type {kind!r} is not supported by this engine; "
                "send text parts only"
            )
    return "\n".join(texts)


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message (the question a call asks), or ""."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def response_text(response: dict[str, Any]) -> str:
    """The text of a chat completion's first choice, or ""."""
    choices = response.get("choices") or [{}]
    return message_text((choices[0].get("message") or {}).get("content"))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _typed_parts(
        cls, value: str | list[dict[str, Any]] | None
    ) -> str | list[dict[str, Any]] | None:
        for number, part in enumerate(value if isinstance(value, list) else []):
            if not isinstance(part.get("type"), str):
                raise ValueError(f"content part {number} needs a string `type`, such as 'text'")
            if part["type"] in TEXT_PART_TYPES and not isinstance(part.get("text"), str):
                raise ValueError(f"content part {number} is a text part: give it a string `text`")
        return value

    def text(self) -> str:
        """The message's text for an engine that reads text only (other parts are refused)."""
        return message_text(self.content, only_text=True)


class ChatRequest(BaseModel):
    """An OpenAI chat completion request. Unknown fields are kept and forwarded upstream."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    # Not OpenAI's, but llama.cpp's and Anthropic's: sample among the k most likely tokens.
    top_k: int | None = Field(None, ge=1)
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    # Set for a legacy text completion (POST /v1/completions): text to continue as it is, with
    # no chat template; `messages` then only holds it as a user turn for engines that need one.
    _raw_prompt: str | None = PrivateAttr(default=None)
    # The client's body exactly as sent, set only while this request is what the client asked
    # (no harness applied): an engine that forwards JSON may send these bytes as they are.
    _raw_body: bytes | None = PrivateAttr(default=None)
    # True when its token limit is the scenario's cap, not what the client asked (`capped`).
    _capped: bool = PrivateAttr(default=False)

    @property
    def raw_prompt(self) -> str | None:
        return self._raw_prompt

    @property
    def raw_body(self) -> bytes | None:
        return self._raw_body

    @property
    def capped_by_server(self) -> bool:
        """Whether its token limit is the server's cap rather than the client's: an answer that
        reaches it ends as at a stop sequence (the client's own limit was not reached)."""
        return self._capped

    def sent_as(self, body: bytes) -> ChatRequest:
        """Mark this request, freshly parsed from `body` and unchanged since, as those bytes."""
        self._raw_body = body
        return self

    def continuing(self, prompt: str) -> ChatRequest:
        """This request as a text completion of `prompt` (no chat template)."""
        copy = self.model_copy()
        copy._raw_prompt = prompt
        copy._raw_body = None
        return copy

    @field_validator("n")
    @classmethod
    def _choices(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_CHOICES:
            raise ValueError(f"n must be from 1 to {MAX_CHOICES}: send more requests for more")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    @field_validator("tools")
    @classmethod
    def _named_functions(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for number, tool in enumerate(value or []):
            function = tool.get("function")
            if not isinstance(tool.get("type"), str):
                raise ValueError(f"tool {number} needs a string `type`, such as 'function'")
            named = isinstance(function, dict) and isinstance(function.get("name"), str)
            if tool["type"] == "function" and not named:
                raise ValueError(f"tool {number} needs `function` with a string `name`")
        return value

    @field_validator("stream_options")
    @classmethod
    def _usage_flag(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value and not isinstance(value.get("include_usage", False), bool):
            raise ValueError("stream_options.include_usage must be true or false")
        return value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_biases(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, dict):
            raise ValueError(
                'logit_bias must be an object of token id to bias, such as {"50256": -100}'
            )
        for key, bias in value.items():
            _check_logit_bias(key, bias)
        return value

    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def capped(self, limit: int | None) -> ChatRequest:
        """This request with at most `limit` tokens to generate (itself when it asks no more)."""
        asked = self.token_limit()
        if limit is None or (asked is not None and asked <= limit):
            return self
        field = "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
        copy = self.model_copy(update={field: limit})
        copy._capped = True
        return copy

    def include_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def _check_logit_bias(key: str, bias: Any) -> None:
    if not TOKEN_ID_KEY.fullmatch(key):
        raise ValueError(f"logit_bias key {key!r} is not a token id: write the id in digits")
    number = isinstance(bias, int | float) and not isinstance(bias, bool)
    if not number or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
        raise ValueError(
            f"logit_bias[{key!r}] must be a number from -{MAX_LOGIT_BIAS} to {MAX_LOGIT_BIAS}, "
            f"got {bias!r}"
        )


# How a choice ended when the engine ended it, in its `reef` field: it was repeating itself.
REPETITION = "repetition"


@dataclass
class Completion:
    """What an engine produced for one request: the OpenAI response plus what training needs."""

    response: dict[str, Any]
    model: str
    token_ids: list[int] | None = None
    token_logprobs: list[float] | None = None
    ttft_ms: float | None = None
    # How long the request waited for the engine to take it (a free slot), where the engine
    # queues requests itself (llama.cpp): part of ttft_ms.
    queue_ms: float | None = None
    # The prompt exactly as the model read it (after a harness and the chat template), where the
    # engine renders it itself: training learns from what was served, not what was sent.
    prompt_token_ids: list[int] | None = None
    # `response` as the bytes the engine received (an upstream's body), answered and stored as
    # they are; whatever changes `response` drops them (see `reef.server.serving`).
    raw_response: bytes | None = None
    # The sampling settings the answer was drawn with, defaults included, where the engine
    # samples itself (temperature, top_p, top_k, min_p, seed, max_tokens, ...).
    sampling: dict[str, Any] | None = None

    @property
    def usage(self) -> dict[str, Any] | None:
        usage = self.response.get("usage")
        return usage if isinstance(usage, dict) else None

    @property
    def looped(self) -> bool:
        """Whether the engine ended the (first) answer because it was repeating itself, which
        clients are told is a "stop" (see reef.engines.llamacpp.repetition)."""
        mark = self._first_choice().get("reef")
        return isinstance(mark, dict) and mark.get("ended_by") == REPETITION

    @property
    def ended_itself(self) -> bool:
        """Whether the (first) answer finished with `finish_reason` "stop" and was not ended by
        the engine for looping: what a learner may take as a whole answer. (A tool call ends
        "tool_calls", an answer cut at its limit "length".)"""
        return self._first_choice().get("finish_reason") == "stop" and not self.looped

    def _first_choice(self) -> dict[str, Any]:
        choices = self.response.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        return first if isinstance(first, dict) else {}


# A stream yields chunk objects, then exactly one Completion as its last item.
StreamItem = dict[str, Any] | Completion


@dataclass
class ChunkFactory:
    """Builds `chat.completion.chunk` objects that share one id, creation time and model."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{time.time_ns():x}")
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
        index: int = 0,
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return self._envelope("chat.completion.chunk", [choice])

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk", []), "usage": usage}

    def completion(
        self,
        message: dict[str, Any],
        finish_reason: str,
        usage: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return self.completion_of([choice], usage)

    def completion_of(self, choices: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        """A `chat.completion` holding `choices` (each with its `index`)."""
        return {**self._envelope("chat.completion", choices), "usage": usage}

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }


@dataclass
class _AssembledChoice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprob_items: list[Any] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        self.role = delta.get("role") or self.role
        if delta.get("content"):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            _merge_tool_call(self.tool_calls, call)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if choice.get("logprobs") and choice["logprobs"].get("content"):
            self.logprob_items.extend(choice["logprobs"]["content"])

    def choice(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role,
            "content": "".join(self.content) if self.content else None,
        }
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "index": index,
            "message": message,
            "logprobs": {"content": self.logprob_items} if self.logprob_items else None,
            "finish_reason": self.finish_reason,
        }


def assemble_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rebuild the `chat.completion` object a streamed response amounts to (every choice)."""
    choices: dict[int, _AssembledChoice] = {}
    usage, head = None, chunks[0] if chunks else {}
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            choices.setdefault(int(choice.get("index") or 0), _AssembledChoice()).add(choice)
    if not choices:
        choices[0] = _AssembledChoice()
    return {
        "id": head.get("id"),
        "object": "chat.completion",
        "created": head.get("created"),
        "model": head.get("model"),
        "choices": [choices[index].choice(index) for index in sorted(choices)],
        "usage": usage,
    }


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]
