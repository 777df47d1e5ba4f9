"""A chat completion read back as an OpenAI Responses API `response`, whole or streamed.

The response id names the record that stores the call: `resp_X` is record `rec_X`, so a later
request's `previous_response_id` finds it. Output items are deterministic per response (`msg_X_0`,
`fc_X_1`, by output index), so a stream's items and its final response agree. Streamed, the
engine's chunks become the typed events the `openai` SDKs parse (`ResponseStreamShape`, for
`serving.streamed`), each with its `sequence_number`; the receipt rides in the final
`response.completed` (or `response.incomplete`) event as `"reef": {"agent_record_id": ...}`,
a field the SDKs ignore, sent after the record is committed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from reef.protocol import Completion, message_text
from reef.server.responses.request import ResponsesRequest


def response_id_of(record_id: str) -> str:
    return "resp_" + record_id.removeprefix("rec_")


def record_id_of(response_id: str) -> str | None:
    """The record a response id names, or None for an id that is not one of Reef's."""
    if not response_id.startswith("resp_"):
        return None
    return "rec_" + response_id.removeprefix("resp_")


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content if status == "completed" else [],
    }


def call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str = "completed",
    namespace: str | None = None,
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    return item if namespace is None else {**item, "namespace": namespace}


def item_id(response_id: str, kind: str, index: int) -> str:
    return f"{kind}_{response_id.removeprefix('resp_')}_{index}"


def output_items(
    response_id: str, asked: ResponsesRequest, chat_response: dict[str, Any]
) -> list[dict[str, Any]]:
    """The first choice's message as output items: its text, then one per tool call."""
    choice = (chat_response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    text = message_text(message.get("content"))
    if text:
        items.append(message_item(item_id(response_id, "msg", 0), text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        at = item_id(response_id, "fc", len(items))
        space = asked.namespace_of(name)
        items.append(call_item(at, call.get("id") or at, name, arguments, namespace=space))
    return items


def usage_of(chat_response: dict[str, Any]) -> dict[str, Any] | None:
    usage = chat_response.get("usage")
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    response_id: str,
    asked: ResponsesRequest,
    model: str | None,
    created_at: float,
    status: str = "in_progress",
) -> dict[str, Any]:
    """A `response` with no output yet: what `response.created` carries, and the frame of the
    finished one."""
    text_format = asked.text.format.shown() if asked.text and asked.text.format else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": asked.instructions,
        "max_output_tokens": asked.max_output_tokens,
        "metadata": asked.metadata or {},
        "model": model or asked.model or "",
        "output": [],
        "parallel_tool_calls": asked.parallel_tool_calls is not False,
        "previous_response_id": asked.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": asked.store,
        "temperature": asked.temperature,
        "text": {"format": text_format or {"type": "text"}},
        "tool_choice": _shown_choice(asked),
        "tools": [tool.model_dump(exclude_none=True) for tool in asked.tools or []],
        "top_p": asked.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": asked.user,
    }


def _shown_choice(asked: ResponsesRequest) -> str | dict[str, Any]:
    choice = asked.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def finished(
    frame: dict[str, Any], chat_response: dict[str, Any], output: list[dict[str, Any]]
) -> dict[str, Any]:
    """`frame` finished: its output, usage, and status (`incomplete` when the token limit cut
    it short, as OpenAI reports `max_output_tokens`)."""
    choice = (chat_response.get("choices") or [{}])[0]
    cut = choice.get("finish_reason") == "length"
    return {
        **frame,
        "status": "incomplete" if cut else "completed",
        "completed_at": None if cut else int(time.time()),
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": chat_response.get("model") or frame["model"],
        "output": output,
        "usage": usage_of(chat_response),
    }


def whole_response(
    response_id: str, asked: ResponsesRequest, chat_response: dict[str, Any]
) -> dict[str, Any]:
    created = float(chat_response.get("created") or time.time())
    frame = response_object(response_id, asked, chat_response.get("model"), created)
    return finished(frame, chat_response, output_items(response_id, asked, chat_response))


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as OpenAI writes the Responses API's."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ResponseStreamShape:
    """Chat chunks as the Responses API's stream events, for `serving.streamed`:
    response.created and response.in_progress, then per output item output_item.added, its
    deltas (content_part.added, output_text.delta ... output_text.done, content_part.done; or
    function_call_arguments.delta ... .done) and output_item.done, then response.completed
    (response.incomplete when cut by the token limit) carrying the receipt."""

    def __init__(self, response_id: str, asked: ResponsesRequest) -> None:
        self.response_id = response_id
        self.asked = asked
        self.sequence = 0
        self.frame: dict[str, Any] | None = None
        self.items: list[dict[str, Any]] = []  # output items so far; the open one is the last
        self.open: str | int | None = None  # "text", a tool call's index, or None
        self.text = ""  # the open message's text so far
        self.record_id: str | None = None

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        self.sequence += 1
        return event(name, {"type": name, "sequence_number": self.sequence - 1, **data})

    def chunk(self, chunk: dict[str, Any]) -> bytes | None:
        out: list[bytes] = []
        if self.frame is None:
            out.append(self._start(chunk))
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                out.append(self._call(call))
            if choice.get("finish_reason"):
                out.append(self._close())
        return b"".join(out) or None

    def _start(self, chunk: dict[str, Any]) -> bytes:
        created = float(chunk.get("created") or time.time())
        self.frame = response_object(self.response_id, self.asked, chunk.get("model"), created)
        response = {"response": self.frame}
        return self._event("response.created", response) + self._event(
            "response.in_progress", response
        )

    def _add(self, key: str | int, item: dict[str, Any]) -> bytes:
        closing = self._close()
        self.open = key
        self.items.append(item)
        added = {"output_index": len(self.items) - 1, "item": item}
        return closing + self._event("response.output_item.added", added)

    def _text(self, text: str) -> bytes:
        out = b""
        index = len(self.items)
        if self.open != "text":
            at = item_id(self.response_id, "msg", index)
            out += self._add("text", message_item(at, "", "in_progress"))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event("response.content_part.added", self._where(part=part))
            self.text = ""
        self.text += text
        return out + self._event("response.output_text.delta", self._where(delta=text, logprobs=[]))

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        key = int(call.get("index") or 0)
        function = call.get("function") or {}
        if self.open != key:
            at = item_id(self.response_id, "fc", len(self.items))
            name = function.get("name") or ""
            space = self.asked.namespace_of(name)
            item = call_item(at, call.get("id") or at, name, "", "in_progress", space)
            out += self._add(key, item)
        pieces = function.get("arguments") or ""
        if pieces:
            self.items[-1]["arguments"] += pieces
            delta = self._where(delta=pieces)
            del delta["content_index"]
            out += self._event("response.function_call_arguments.delta", delta)
        return out

    def _where(self, **data: Any) -> dict[str, Any]:
        item = self.items[-1]
        at = {"item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}
        return {**at, **data}

    def _close(self) -> bytes:
        """Finish the open item: its done events, and the item as it ends in the output."""
        if self.open is None:
            return b""
        self.open = None
        item = self.items[-1]
        if item["type"] == "message":
            text = self.text
            done = message_item(item["id"], text)
            part = done["content"][0]
            out = self._event("response.output_text.done", self._where(text=text, logprobs=[]))
            out += self._event("response.content_part.done", self._where(part=part))
        else:
            done = {**item, "status": "completed"}
            arguments = self._where(arguments=item["arguments"], name=item["name"])
            del arguments["content_index"]
            out = self._event("response.function_call_arguments.done", arguments)
        self.items[-1] = done
        item_done = {"output_index": len(self.items) - 1, "item": done}
        return out + self._event("response.output_item.done", item_done)

    def receipt(self, completion: Completion, record_id: str) -> bytes:
        self.record_id = record_id  # sent with response.completed, the event that follows
        return b""

    def stored(self, completion: Completion) -> Completion:
        return completion  # the record holds the chat completion, as for chat

    def end(self, completion: Completion) -> bytes:
        out = b"" if self.frame is not None else self._start(completion.response)
        out += self._close()
        assert self.frame is not None
        response = finished(self.frame, completion.response, self.items)
        name = f"response.{response['status']}"
        data: dict[str, Any] = {"response": response}
        if self.record_id is not None:
            data["reef"] = {"agent_record_id": self.record_id}
        return out + self._event(name, data)

    def failed(self, error: dict[str, Any]) -> bytes:
        """An `error` event (which the SDKs raise), then `response.failed`."""
        detail = error.get("error") or {}
        code, message = detail.get("code") or "server_error", str(detail.get("message") or "")
        nested = {"type": "server_error", "code": code, "message": message}  # what the SDKs raise
        data = {"code": code, "message": message, "param": None, "error": nested}
        out = self._event("error", data)
        if self.frame is None:
            return out
        failed = {**self.frame, "status": "failed", "output": self.items}
        failed["error"] = {"code": "server_error", "message": message}
        return out + self._event("response.failed", {"response": failed})
