"""The OpenAI Responses API request (`POST /v1/responses`) as a chat request the engines serve.

`ResponsesRequest` validates what Reef translates and refuses what it cannot honour (images and
files, background runs, stored prompts, conversations); tools no engine here can run (hosted
ones such as web_search, freeform custom tools) are accepted and not offered to the model.
`as_chat` turns it into an OpenAI chat request body: `instructions` first as a system message,
then the history of the response named by `previous_response_id` (read back from its record),
then the input items as chat messages. The answer's side lives in `output`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from reef.errors import ReefError

ITEM_TYPES = ("message", "function_call", "function_call_output")
PART_TYPES = ("input_text", "output_text", "text", "refusal")

# What the record's request carries beside the chat body, so that a later call chaining from
# it (previous_response_id) can drop its instructions, as OpenAI does.
MARKER = "responses_api"


class _Open(BaseModel):
    # Items and parts echoed back from earlier answers carry fields this translation does not
    # read (ids, status, annotations, logprobs): they are accepted and ignored.
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


def _parts_text(content: str | list[Part]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[Part]


def _item_type(value: Any) -> str:
    """An item's `type`; a bare `{"role", "content"}` (the SDKs' easy input message) is one."""
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        for key in ("description", "parameters", "strict"):
            if getattr(self, key) is not None:
                function[key] = getattr(self, key)
        return {"type": "function", "function": function}


class HostedTool(_Open):
    """A tool the platform runs (web_search, file_search, code_interpreter, mcp, ...) or a
    freeform `custom` tool: no engine here can run or parse it, so it is not offered."""

    type: str


def _tool_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "namespace") else "hosted"


InnerTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_type),
]


class NamespaceTool(BaseModel):
    """Function tools grouped under a name; offered to the model as plain function tools."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[InnerTool]


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_type),
]


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def as_chat(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        schema: dict[str, Any] = {"name": self.name, "schema": self.schema_}
        if self.strict is not None:
            schema["strict"] = self.strict
        return {"type": "json_schema", "json_schema": schema}

    def shown(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, not used


class ResponsesRequest(BaseModel):
    """A Responses API request: what Reef translates, plus fields accepted and not used
    (`reasoning`, `include`, `user`, `safety_identifier`, `prompt_cache_key`, `service_tier`,
    `stream_options`, `truncation`, `text.verbosity`, `max_tool_calls`, `client_metadata`).
    Tools other than functions are accepted and not offered to the model. Anything else is
    refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    background: Literal[False] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    client_metadata: dict[str, Any] | None = None  # Codex's: its ids, for OpenAI's logs

    @field_validator("input")
    @classmethod
    def _something(cls, value: str | list[Item]) -> str | list[Item]:
        if not value:
            raise ValueError("send some input: a string, or a list of at least one item")
        return value

    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def as_chat(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat request body: instructions, then `history`, then the input items."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages.extend(history)
        messages.extend(chat_messages(self.items()))
        body: dict[str, Any] = {"messages": messages}
        for name in ("model", "temperature", "top_p", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.functions():
            body["tools"] = [tool.as_chat() for tool, _ in self.functions()]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text and self.text.format and self.text.format.type != "text":
            body["response_format"] = self.text.format.as_chat()
        if self.stream:
            body["stream"] = True
        return body

    def functions(self) -> list[tuple[FunctionTool, str | None]]:
        """The function tools offered to the model, each with its namespace (if any)."""
        found: list[tuple[FunctionTool, str | None]] = []
        for tool in self.tools or []:
            if isinstance(tool, FunctionTool):
                found.append((tool, None))
            elif isinstance(tool, NamespaceTool):
                inner = [t for t in tool.tools if isinstance(t, FunctionTool)]
                found.extend((function, tool.name) for function in inner)
        return found

    def namespace_of(self, name: str) -> str | None:
        return next((space for tool, space in self.functions() if tool.name == name), None)

    def not_offered(self) -> list[str]:
        """The types of the tools the model is not offered (no engine here runs them)."""
        hosted: list[str] = []
        for tool in self.tools or []:
            inner = tool.tools if isinstance(tool, NamespaceTool) else [tool]
            hosted.extend(t.type for t in inner if isinstance(t, HostedTool))
        return hosted

    def recorded(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        """What the record stores as its request: the chat body, and what chaining needs."""
        marker = {
            "instructions": bool(self.instructions),
            "previous_response_id": self.previous_response_id,
            "tools_not_offered": self.not_offered(),
        }
        return {**chat_body, MARKER: marker}


def parsed(data: dict[str, Any]) -> ResponsesRequest:
    """The request validated, or a 400 naming the first field at fault (`param`)."""
    _check_items(data.get("input"))
    try:
        asked = ResponsesRequest.model_validate(data)
    except ValidationError as error:
        raise _refusal(error) from None
    _check_choice(asked)
    return asked


def _check_choice(asked: ResponsesRequest) -> None:
    choice, names = asked.tool_choice, [tool.name for tool, _ in asked.functions()]
    if choice == "required" and not names:
        message = 'tool_choice "required" needs function `tools` to choose from'
    elif isinstance(choice, FunctionChoice) and choice.name not in names:
        message = f"tool_choice names {choice.name!r}, which is not one of `tools`"
    else:
        return
    raise ResponsesError(message, status=400, code="invalid_request", param="tool_choice")


def _refusal(error: ValidationError) -> ResponsesError:
    problems = error.errors()
    # `input` is a string or a list: when the list did not validate, the string branch's
    # complaint is noise.
    meant = [p for p in problems if p["loc"][-1:] != ("str",)] or problems
    lines, params = [], []
    for problem in meant:
        param = _param(problem["loc"])
        params.append(param)
        if problem["type"] == "extra_forbidden":
            lines.append(f"{param}: unknown field, which Reef does not translate")
        elif problem["type"] == "missing":
            lines.append(f"{param}: required")
        else:
            got = repr(problem.get("input"))
            got = got if len(got) <= 80 else got[:77] + "..."
            lines.append(f"{param}: {problem['msg'].removeprefix('Value error, ')} (got {got})")
    return ResponsesError("; ".join(lines), status=400, code="invalid_request", param=params[0])


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a field path (`input[0].role`), without its union branch names."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" not in part and part not in ("str", *ITEM_TYPES):
            path += f".{part}" if path else part
    return path or "body"


def _check_items(items: Any) -> None:
    for number, item in enumerate(items if isinstance(items, list) else []):
        kind = _item_type(item)
        if kind not in ITEM_TYPES:
            raise ResponsesError(
                f"input[{number}] is a {kind!r} item, which Reef does not translate: send "
                f"{', '.join(ITEM_TYPES)} items",
                status=400,
                code="unsupported_input",
                param=f"input[{number}]",
            )
        content = item.get("content") if isinstance(item, dict) else None
        for index, part in enumerate(content if isinstance(content, list) else []):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type not in PART_TYPES:
                raise ResponsesError(
                    f"input[{number}].content[{index}] is a {part_type!r} part: the engines "
                    "read text only; send input_text parts",
                    status=400,
                    code="unsupported_input",
                    param=f"input[{number}].content[{index}]",
                )


def _chat_tool_choice(choice: str | FunctionChoice) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def chat_messages(
    items: list[MessageItem | FunctionCallItem | FunctionCallOutputItem],
) -> list[dict[str, Any]]:
    """Input items as chat messages: function calls join the assistant turn before them (or
    start one), and each function call output is a `tool` message."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _parts_text(item.content)})
        elif isinstance(item, FunctionCallItem):
            _assistant_turn(out).setdefault("tool_calls", []).append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
            )
        else:
            content = _parts_text(item.output)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
    return out


def _assistant_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def history_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a stored record holds (its request's messages, less its instructions,
    and its answer), to go before a call that names it as `previous_response_id`."""
    request = record["request"]
    messages = list(request.get("messages") or [])
    if (request.get(MARKER) or {}).get("instructions") and messages:
        messages = messages[1:]
    choices = record["response"].get("choices") or [{}]
    answer = choices[0].get("message") or {}
    turn: dict[str, Any] = {"role": "assistant", "content": answer.get("content")}
    if answer.get("tool_calls"):
        turn["tool_calls"] = answer["tool_calls"]
    return [*messages, turn]


class ResponsesError(ReefError):
    """A refusal naming the request field (`param`) it is about."""

    def __init__(self, message: str, *, status: int, code: str, param: str | None) -> None:
        super().__init__(message, status=status, code=code)
        self.param = param
        self.type = "invalid_request_error" if status < 500 else "server_error"


def error_body(error: ReefError) -> dict[str, Any]:
    """Any Reef error in the Responses API's shape: `{"error": {message, type, param, code}}`."""
    param = error.param if isinstance(error, ResponsesError) else None
    detail = {"message": error.message, "type": error.type, "param": param, "code": error.code}
    return {"error": detail}
