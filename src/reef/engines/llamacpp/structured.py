"""Structured output for engines that constrain sampling with a GBNF grammar (llama.cpp).

A request's `response_format` (`json_object`, or `json_schema` in OpenAI's shape) becomes a
grammar for the whole answer. A `tool_choice` that forces a call (a named function, or
"required": any of `tools`) becomes a grammar for the text

    {"name": "<function>", "arguments": <the function's parameters, as its schema says>}

which `ToolCallText` reads back (whole or while it grows) into OpenAI's `tool_calls` shape. The
function's name comes first so the model reads which function it is filling in.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from reef.errors import BadRequest, Unsupported
from reef.protocol import ChatRequest

ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
TOOL_CALL_START = '{"name": '
TOOL_CALL_ARGUMENTS = ', "arguments": '


@dataclass(frozen=True)
class OutputConstraint:
    """A GBNF grammar for the answer; `tool_names` is set when the answer is a forced tool call."""

    grammar: str
    tool_names: tuple[str, ...] = ()

    @property
    def is_tool_call(self) -> bool:
        return bool(self.tool_names)


def output_constraint(request: ChatRequest) -> OutputConstraint | None:
    """The grammar `request` asks for, or None for free text. Refuses shapes it cannot honour."""
    forced = forced_tools(request)
    if forced:
        if _response_format_type(request) not in (None, "text"):
            raise BadRequest(
                "response_format and a forced tool_choice cannot both shape one answer: "
                "send one of them"
            )
        return OutputConstraint(_tool_call_grammar(forced), tuple(name for name, _ in forced))
    schema = _response_schema(request)
    if schema is None:
        return None
    return OutputConstraint(_schema_grammar(schema, "response_format.json_schema.schema"))


def forced_tools(request: ChatRequest) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of the functions `tool_choice` forces a call to; [] if none."""
    choice = request.tool_choice
    if choice in (None, "auto", "none"):
        return []
    functions = _functions(request)
    if choice == "required":
        if not functions:
            raise BadRequest('tool_choice "required" needs `tools` with at least one function')
        return list(functions.items())
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise BadRequest('tool_choice needs {"type": "function", "function": {"name": ...}}')
        if name not in functions:
            known = ", ".join(sorted(functions)) or "none"
            raise BadRequest(
                f"tool_choice names function {name!r}, which is not in `tools` (functions: "
                f"{known}): add it to `tools` or name one of them"
            )
        return [(name, functions[name])]
    raise Unsupported(
        f"tool_choice {json.dumps(choice)[:100]} is not supported: send 'auto', 'none', "
        '\'required\' or {"type": "function", "function": {"name": ...}}'
    )


def _functions(request: ChatRequest) -> dict[str, dict[str, Any]]:
    functions = {}
    for tool in request.tools or []:
        if tool.get("type") == "function":
            function = tool["function"]
            parameters = function.get("parameters") or ANY_OBJECT_SCHEMA
            if not isinstance(parameters, dict):
                raise BadRequest(
                    f"tool {function['name']!r}: `parameters` must be a JSON schema object"
                )
            functions[function["name"]] = parameters
    return functions


def _response_format_type(request: ChatRequest) -> str | None:
    form = request.response_format
    if form is None:
        return None
    kind = form.get("type")
    if not isinstance(kind, str):
        raise BadRequest(
            "response_format needs a string `type`: 'text', 'json_object' or 'json_schema'"
        )
    return kind


def _response_schema(request: ChatRequest) -> dict[str, Any] | None:
    kind = _response_format_type(request)
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ANY_OBJECT_SCHEMA
    if kind != "json_schema":
        raise Unsupported(
            f"response_format type {kind!r} is not supported: send 'text', 'json_object' or "
            "'json_schema'"
        )
    spec = (request.response_format or {}).get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise BadRequest(
            'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}'
        )
    schema = spec.get("schema", ANY_OBJECT_SCHEMA)
    if not isinstance(schema, dict):
        raise BadRequest("response_format.json_schema.schema must be a JSON schema object")
    return schema


def _converter() -> Any:
    from llama_cpp.llama_grammar import SchemaConverter

    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


# llama-cpp-python's converter lets a JSON string hold raw control characters (a newline, a
# tab), which JSON forbids: sampled output then fails to parse now and then. Strings may hold
# them only escaped, as the JSON grammar says.
LOOSE_STRING_CHAR = r'char ::= [^"\\] |'
JSON_STRING_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def _grammar_text(converter: Any) -> str:
    return str(converter.format_grammar()).replace(LOOSE_STRING_CHAR, JSON_STRING_CHAR)


def _schema_grammar(schema: dict[str, Any], where: str) -> str:
    converter = _converter()
    try:
        converter.visit(converter.resolve_refs(schema, "request"), "")
    except Exception as error:  # the converter raises plain exceptions for what it cannot read
        raise Unsupported(f"{where} cannot be turned into a grammar: {error}") from None
    return _grammar_text(converter)


def _tool_call_grammar(functions: list[tuple[str, dict[str, Any]]]) -> str:
    converter = _converter()
    alternatives = []
    for number, (name, parameters) in enumerate(functions):
        try:
            rule = converter.visit(
                converter.resolve_refs(parameters, "request"), f"tool-{number}-arguments"
            )
        except Exception as error:
            raise Unsupported(
                f"the parameters of tool {name!r} cannot be turned into a grammar: {error}"
            ) from None
        opening = TOOL_CALL_START + json.dumps(name) + TOOL_CALL_ARGUMENTS
        alternatives.append(f'{converter._format_literal(opening)} {rule} "}}"')
    converter._add_rule("root", " | ".join(alternatives))
    return _grammar_text(converter)


@dataclass
class ToolCallText:
    """Reads `{"name": ..., "arguments": ...}` as it is generated, into OpenAI tool-call deltas.

    The name is known once its opening is complete; the arguments are everything after it but
    the closing brace (and the whitespace before it), so a stream can send them as they grow.
    """

    names: tuple[str, ...]
    id: str = field(default_factory=lambda: f"call_{time.time_ns():x}")
    name: str | None = None
    arguments_start: int = 0
    arguments_sent: int = 0

    def deltas(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The tool-call deltas `text` adds to what was sent (all of it when `final`)."""
        out: list[dict[str, Any]] = []
        if self.name is None and not self._read_name(text):
            return out
        if self.arguments_sent == 0:
            out.append(self._opening())
            self.arguments_sent = self.arguments_start
        ready = self._arguments_end(text, final)
        if ready > self.arguments_sent:
            piece = text[self.arguments_sent : ready]
            out.append({"index": 0, "function": {"arguments": piece}})
            self.arguments_sent = ready
        return out

    def message(self, text: str) -> dict[str, Any]:
        """The whole assistant message for `text` (the arguments as far as they got)."""
        if self.name is None and not self._read_name(text):
            return {"role": "assistant", "content": text}
        arguments = text[self.arguments_start : self._arguments_end(text, final=True)]
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def _read_name(self, text: str) -> bool:
        for name in self.names:
            opening = TOOL_CALL_START + json.dumps(name) + TOOL_CALL_ARGUMENTS
            if text.startswith(opening):
                self.name, self.arguments_start = name, len(opening)
                return True
        return False

    def _opening(self) -> dict[str, Any]:
        return {
            "index": 0,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }

    def _arguments_end(self, text: str, final: bool) -> int:
        body = text[self.arguments_start :]
        if final and body.endswith("}"):
            # The grammar closes the wrapper with exactly one brace after the arguments.
            complete = _parses(body[:-1])
            body = body[:-1] if complete else body
        elif not final:
            body = body[:-1]  # the last character may be the wrapper's closing brace
        return self.arguments_start + len(body.rstrip())


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
