"""The Anthropic Messages API (`POST /v1/messages`) as chat requests the engines already serve.

Pure translation, both ways: an Anthropic request (validated by `MessagesRequest`) becomes an
OpenAI chat request body, and the engine's `chat.completion` becomes an Anthropic `message`;
streamed, the engine's chunks become Anthropic's named server-sent events (`MessageStreamShape`,
for `serving.streamed`). The record stores the chat side of both, so recipes see the same
trajectories whichever API served them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reef.errors import ReefError
from reef.protocol import Completion, message_text

# The chat request takes at most 4 stop sequences (ChatRequest._stop_list).
MAX_STOP_SEQUENCES = 4
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
# Anthropic's error `type` for a status (its own names; 503 is its overloaded_error).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class _Block(BaseModel):
    # Blocks keep fields this translation does not use (cache_control, citations) and ignore them.
    model_config = ConfigDict(extra="allow")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content)


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # `system` mid-conversation (Claude Code sends it): text only, a chat system message.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _blocks_of_role(self) -> Message:
        for wrong, right in (("tool_use", "assistant"), ("tool_result", "user")):
            if self.role != right and any(block.type == wrong for block in self.blocks()):
                raise ValueError(f"{wrong} blocks belong in {right} messages")
        return self

    def blocks(self) -> list[TextBlock | ToolUseBlock | ToolResultBlock]:
        return (
            [TextBlock(type="text", text=self.content)]
            if isinstance(self.content, str)
            else list(self.content)
        )


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the tool\'s `name`')
        return self

    def as_chat(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")

    # "adaptive" lets the model decide whether to think, "enabled" (with its `budget_tokens`)
    # asks it to: the served models have no thinking, so neither gives a thinking block.
    type: Literal["disabled", "adaptive", "enabled"]


class JsonOutputFormat(BaseModel):
    """Structured output: the answer's text is JSON valid against `schema` (chat's
    `response_format` json_schema, enforced by grammar on llama.cpp)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    def as_chat(self) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": self.schema_}}


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    effort: str | None = None  # accepted, not used: the served models do not reason
    format: JsonOutputFormat | None = None


class MessagesRequest(BaseModel):
    """An Anthropic Messages request: what Reef translates, and nothing it would have to ignore."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)  # llama.cpp samples with it; chat's `top_k`
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # accepted and not used (user_id)
    thinking: Thinking | None = None  # accepted (disabled, adaptive, enabled); no thinking block
    context_management: dict[str, Any] | None = None  # accepted, not used (no thinking to clear)
    output_config: OutputConfig | None = None

    @model_validator(mode="after")
    def _known_tool(self) -> MessagesRequest:
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f'tool_choice of type "{choice.type}" needs `tools`')
        names = {tool.name for tool in self.tools or []}
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not one of `tools`")
        return self

    def as_chat(self) -> dict[str, Any]:
        """The OpenAI chat request body this request amounts to."""
        messages: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else _joined(self.system)
            messages.append({"role": "system", "content": system})
        for message in self.messages:
            messages.extend(_chat_messages(message))
        body: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens}
        if self.model is not None:
            body["model"] = self.model
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.tools:
            body["tools"] = [_chat_tool(tool) for tool in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice.as_chat()
            if self.tool_choice.disable_parallel_tool_use is not None:
                body["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        if self.output_config is not None and self.output_config.format is not None:
            body["response_format"] = self.output_config.format.as_chat()
        if self.stream:
            body["stream"] = True
        return body


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: a Messages request less what only shapes the answer
    (`max_tokens`, sampling, `stream`); what it counts is the prompt."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    context_management: dict[str, Any] | None = None
    output_config: OutputConfig | None = None


def _joined(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


def _chat_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _chat_messages(message: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user turn's tool results come first, each its
    own `tool` message (chat wants them right after the assistant's calls), then its text."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "system":
        lines = [block.text for block in message.content if isinstance(block, TextBlock)]
        return [{"role": "system", "content": "\n".join(lines)}]  # only text blocks validate
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        else:
            text = block.text()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": f"Error: {text}" if block.is_error else text,
                }
            )
    if message.role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        return [turn]
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def message_id(response: dict[str, Any]) -> str:
    return "msg_" + str(response.get("id") or "").removeprefix("chatcmpl-")


def stop_reason(finish_reason: str | None) -> str:
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def stopped(choice: dict[str, Any]) -> tuple[str, str | None]:
    """The `stop_reason` and `stop_sequence` of a chat choice. A stop sequence is named where
    the engine says which one matched (vLLM and upstreams built on it put it in the choice's
    `stop_reason`); llama.cpp does not, so its stops are `end_turn`."""
    matched = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(matched, str) and matched:
        return "stop_sequence", matched
    return stop_reason(choice.get("finish_reason")), None


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the `input` object; text that is not an object is kept whole."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _usage(response: dict[str, Any]) -> dict[str, int]:
    """Anthropic's usage: the prompt's tokens (none of them written to or read from a prompt
    cache in Anthropic's sense: the engine's own prefix cache is not billed), the answer's."""
    usage = response.get("usage") or {}
    return usage_of(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def usage_of(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def anthropic_message(response: dict[str, Any]) -> dict[str, Any]:
    """A `chat.completion` (its first choice) as an Anthropic `message`."""
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reason, sequence = stopped(choice)
    content: list[dict[str, Any]] = []
    text = message_text(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": tool_input(function.get("arguments") or ""),
            }
        )
    return {
        "id": message_id(response),
        "type": "message",
        "role": "assistant",
        "model": response.get("model"),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(response),
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_of(error: ReefError) -> dict[str, Any]:
    return error_body(error.status, error.message)


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as Anthropic writes them."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class MessageStreamShape:
    """Chat chunks as Anthropic's stream events, for `serving.streamed`: message_start,
    content_block_start / _delta / _stop per text or tool_use block, then message_delta and
    message_stop. The receipt is a `ping` event (the SDKs skip pings) sent before message_delta:
    `{"type": "ping", "reef": {"agent_record_id": ...}}`."""

    def __init__(self, input_tokens: int = 0) -> None:
        self.input_tokens = input_tokens  # the prompt's, where the engine can count them
        self.started = False
        self.blocks = 0  # blocks started so far; the open one is the last
        self.open: str | int | None = None  # "text", a tool call's index, or None

    def chunk(self, chunk: dict[str, Any]) -> bytes | None:
        out: list[bytes] = []
        if not self.started:
            out.append(self._start(chunk))
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.open != "text":
                    out.append(self._open("text", {"type": "text", "text": ""}))
                text = {"type": "text_delta", "text": delta["content"]}
                out.append(self._delta(text))
            for call in delta.get("tool_calls") or []:
                out.extend(self._tool_delta(call))
            if choice.get("finish_reason"):
                out.append(self._close())
        return b"".join(out) or None

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self.started = True
        message: dict[str, Any] = {
            "id": message_id(chunk),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_of(self.input_tokens, 0),
        }
        return event("message_start", {"type": "message_start", "message": message})

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        out = []
        key = int(call.get("index") or 0)
        function = call.get("function") or {}
        if self.open != key:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": {},
            }
            out.append(self._open(key, block))
        if function.get("arguments"):
            partial = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(self._delta(partial))
        return out

    def _open(self, key: str | int, block: dict[str, Any]) -> bytes:
        closing = self._close()
        self.open = key
        self.blocks += 1
        index = self.blocks - 1
        start = {"type": "content_block_start", "index": index, "content_block": block}
        return closing + event("content_block_start", start)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}
        return event("content_block_delta", data)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        data = {"type": "content_block_stop", "index": self.blocks - 1}
        return event("content_block_stop", data)

    def receipt(self, completion: Completion, record_id: str) -> bytes:
        return event("ping", {"type": "ping", "reef": {"agent_record_id": record_id}})

    def stored(self, completion: Completion) -> Completion:
        return completion  # the record holds the chat completion, as for chat

    def end(self, completion: Completion) -> bytes:
        message = anthropic_message(completion.response)
        head = b"" if self.started else self._start(completion.response)
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": message["stop_reason"],
                "stop_sequence": message["stop_sequence"],
            },
            "usage": message["usage"],
        }
        stop = event("message_stop", {"type": "message_stop"})
        return head + self._close() + event("message_delta", delta) + stop

    def failed(self, error: dict[str, Any]) -> bytes:
        detail = error.get("error") or {}
        body = {
            "type": "error",
            "error": {"type": "api_error", "message": str(detail.get("message") or "")},
        }
        return event("error", body)
