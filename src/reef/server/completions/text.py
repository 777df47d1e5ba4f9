"""Legacy text completions (`POST /v1/completions`) as chat requests the engines already serve.

The prompt is continued as it is, with no chat template (`ChatRequest.continuing`); the answer
is the chat completion read back into the `text_completion` shape, logprobs included in the old
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` form.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.protocol import ChatRequest, Completion
from reef.server.serving import with_response

# OpenAI's default for this route: a text completion is short unless asked otherwise.
DEFAULT_MAX_TOKENS = 16
SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stream",
    "stream_options",
)


class TextCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    best_of: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("send one prompt per request (a string, or a list of one string)")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (fill in the middle) is not supported: leave it out")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("best_of is not supported: use n to get several completions")
        return value

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def as_chat(self) -> ChatRequest:
        fields = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        fields = {name: value for name, value in fields.items() if value is not None}
        if self.logprobs is not None:
            fields.update(logprobs=True, top_logprobs=self.logprobs)
        # The route applies the release's binding, then makes it a completion of the text.
        return ChatRequest.model_validate(
            {"model": self.model, "messages": [{"role": "user", "content": self.text()}], **fields}
        )


def text_completion(response: dict[str, Any], prompt: str, echo: bool) -> dict[str, Any]:
    """A `chat.completion` as a `text_completion`."""
    choices = [_text_choice(choice, prompt if echo else "") for choice in response["choices"]]
    return {
        "id": _completion_id(response),
        "object": "text_completion",
        "created": response.get("created"),
        "model": response.get("model"),
        "choices": choices,
        "usage": response.get("usage"),
    }


def _text_choice(choice: dict[str, Any], prefix: str) -> dict[str, Any]:
    message = choice.get("message") or {}
    chat_logprobs = (choice.get("logprobs") or {}).get("content")
    text_choice = {
        "index": choice.get("index", 0),
        "text": prefix + (message.get("content") or ""),
        "logprobs": _legacy_logprobs(chat_logprobs, len(prefix)) if chat_logprobs else None,
        "finish_reason": choice.get("finish_reason"),
    }
    if "reef" in choice:  # why the engine ended it (reef.protocol.REPETITION), kept on record
        text_choice["reef"] = choice["reef"]
    return text_choice


def _legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": [entry["token"] for entry in entries],
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [
            {top["token"]: top["logprob"] for top in entry.get("top_logprobs") or []}
            for entry in entries
        ],
        "text_offset": offsets,
    }


def _completion_id(response: dict[str, Any]) -> str:
    """The chat completion's id as a text completion's (unchanged if it already is one)."""
    return "cmpl-" + str(response.get("id") or "").removeprefix("chatcmpl-").removeprefix("cmpl-")


class TextStreamShape:
    """Chat chunks as `text_completion` chunks, for `serving.streamed`."""

    def __init__(self, prompt: str, echo: bool) -> None:
        self.prompt, self.echo = prompt, echo
        self.echoed: set[int] = set()
        self.offsets: dict[int, int] = {}  # choice index -> text offset of its next token

    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        choices = [self._text_delta(choice) for choice in chunk.get("choices") or []]
        shown = [choice for choice in choices if choice is not None]
        if not shown and not chunk.get("usage"):
            return None
        out = {
            "id": _completion_id(chunk),
            "object": "text_completion",
            "created": chunk.get("created"),
            "model": chunk.get("model"),
            "choices": shown,
        }
        return {**out, "usage": chunk["usage"]} if chunk.get("usage") else out

    def _text_delta(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        index = choice.get("index", 0)
        text = (choice.get("delta") or {}).get("content") or ""
        if self.echo and index not in self.echoed:
            self.echoed.add(index)
            text = self.prompt + text
        if not text and not choice.get("finish_reason"):
            return None
        logprobs = (choice.get("logprobs") or {}).get("content")
        legacy = None
        if logprobs:
            start = self.offsets.get(index, len(self.prompt) if self.echo else 0)
            legacy = _legacy_logprobs(logprobs, start)
            self.offsets[index] = start + sum(len(entry["token"]) for entry in logprobs)
        return {
            "index": index,
            "text": text,
            "logprobs": legacy,
            "finish_reason": choice.get("finish_reason"),
        }

    def receipt(self, completion: Completion, record_id: str) -> dict[str, Any]:
        response = completion.response
        return {
            "id": _completion_id(response),
            "object": "text_completion",
            "created": response.get("created"),
            "model": response.get("model"),
            "choices": [],
            "reef": {"agent_record_id": record_id},
        }

    def stored(self, completion: Completion) -> Completion:
        return with_response(
            completion, text_completion(completion.response, self.prompt, self.echo)
        )
