"""A corpus of bad requests against the real server: each a 4xx in OpenAI's error shape whose
message names what to fix, none stored, and the server serves a normal request afterwards."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from reef.errors import BadRequest
from reef.protocol import ChatMessage, message_text
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SMALL_ENGINE, write_config
from tests.server.test_server_api import HI, record_count

JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Bad:
    """One bad request: a body (an object, or raw text or bytes as sent), what its error says."""

    name: str
    body: dict[str, Any] | str | bytes
    says: str
    status: int = 400
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))

    def payloads(self) -> list[bytes]:
        """As sent; an object also once more as a stream (a stream must be refused alike)."""
        if isinstance(self.body, bytes):
            return [self.body]
        if isinstance(self.body, str):
            return [self.body.encode()]
        sent = [json.dumps(self.body).encode()]
        if "stream" not in self.body:
            sent.append(json.dumps({**self.body, "stream": True}).encode())
        return sent


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": HI, "max_tokens": 1, **fields}


def said(content: Any, **fields: Any) -> dict[str, Any]:
    """A request whose one user message has this content (and message fields)."""
    return {"messages": [{"role": "user", "content": content, **fields}], "max_tokens": 1}


TOO_DEEP = '{"messages": ' + "[" * 5000 + "]" * 5000 + "}"
ONE_USER = '{"messages": [{"role": "user", "content": "hi"}], '

BAD_CHATS = [
    # The body as a whole.
    Bad("not-json", "{not json", "not valid JSON"),
    Bad("truncated-json", ONE_USER[:-3], "not valid JSON"),
    Bad("array-body", "[1, 2]", "JSON object"),
    Bad("string-body", '"hello"', "JSON object"),
    Bad("null-body", "null", "JSON object"),
    Bad("empty-body", "", "empty"),
    Bad("invalid-utf8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
    Bad(
        "utf8-encoded-surrogate",
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        "UTF-8",
    ),
    Bad("lone-surrogate", said("\ud800"), "messages.0.content: a string holds a lone UTF-16"),
    Bad("lone-low-surrogate-key", chat(metadata={"\udc00": 1}), "metadata (one of its keys)"),
    Bad("nested-5000-deep", TOO_DEEP, "more than 64 deep"),
    Bad("nested-100-deep-extra", chat(extra=json.loads("[" * 99 + "]" * 99)), "64 deep"),
    Bad("nan-literal", ONE_USER + '"temperature": NaN}', "NaN"),
    Bad("infinity-literal", ONE_USER + '"extra": -Infinity}', "-Infinity"),
    Bad("number-beyond-double", ONE_USER + '"extra": 1e400}', "too large"),
    Bad("integer-of-5000-digits", ONE_USER + '"seed": ' + "9" * 5000 + "}", "5000 digits"),
    # Messages.
    Bad("no-messages", {"max_tokens": 3}, "messages: required"),
    Bad("empty-messages", {"messages": []}, "messages"),
    Bad("messages-an-object", {"messages": {"role": "user", "content": "hi"}}, "messages"),
    Bad("message-a-string", {"messages": ["hi"]}, "messages.0"),
    Bad("unknown-role", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    Bad("no-role", {"messages": [{"content": "x"}]}, "messages.0.role: required"),
    Bad("content-a-number", said(42), "messages.0.content"),
    Bad("content-part-a-string", said(["hi"]), "messages.0.content"),
    Bad("content-part-without-type", said([{"text": "hi"}]), "needs a string `type`"),
    Bad("text-part-without-text", said([{"type": "text"}]), "give it a string `text`"),
    Bad(
        "image-part-on-llamacpp",
        said([{"type": "image_url", "image_url": {"url": "x"}}]),
        "image_url",
    ),
    Bad("name-a-number", said("hi", name=5), "messages.0.name"),
    Bad("tool-calls-a-string", said("hi", tool_calls="call"), "messages.0.tool_calls"),
    Bad("longer-than-the-context", said("word " * 2500), "context window"),
    # Sampling and the other fields.
    Bad("model-a-number", chat(model=5), "model"),
    Bad("n-of-9", chat(n=9), "n must be from 1 to 8"),
    Bad("n-of-0", chat(n=0), "n must be from 1 to 8"),
    Bad("temperature-7", chat(temperature=7), "temperature"),
    Bad("temperature-a-word", chat(temperature="hot"), "temperature"),
    Bad("top-p-0", chat(top_p=0), "top_p"),
    Bad("max-tokens-0", chat(max_tokens=0), "max_tokens"),
    Bad("max-tokens-negative", chat(max_tokens=-5), "max_tokens"),
    Bad("max-tokens-a-word", chat(max_tokens="many"), "max_tokens"),
    Bad("max-completion-tokens-fraction", chat(max_completion_tokens=1.5), "max_completion_tokens"),
    Bad("five-stops", chat(stop=["a", "b", "c", "d", "e"]), "at most 4 stop sequences"),
    Bad("stop-a-number-list", chat(stop=[1]), "stop"),
    Bad("stop-an-object", chat(stop={"x": 1}), "stop"),
    Bad("top-logprobs-21", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    Bad("presence-penalty-3", chat(presence_penalty=3), "presence_penalty"),
    Bad("stream-a-word", chat(stream="sometimes"), "stream"),
    Bad("include-usage-a-word", chat(stream_options={"include_usage": "x"}), "include_usage"),
    Bad("tools-a-string", chat(tools="all"), "tools"),
    Bad("tool-without-function", chat(tools=[{"type": "function"}]), "string `name`"),
    Bad(
        "tool-choice-of-an-unknown-function",
        chat(
            tool_choice={"type": "function", "function": {"name": "g"}},
            tools=[{"type": "function", "function": {"name": "f"}}],
        ),
        "not in `tools`",
    ),
    Bad("tool-choice-required-without-tools", chat(tool_choice="required"), "needs `tools`"),
    Bad("xml-response-format", chat(response_format={"type": "xml"}), "'xml' is not supported"),
    Bad(
        "json-schema-without-a-name",
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        '{"name": ..., "schema": {...}}',
    ),
    Bad("logit-bias-a-list", chat(logit_bias=[1]), "logit_bias must be an object"),
    Bad("logit-bias-word-key", chat(logit_bias={"hello": 5}), "'hello' is not a token id"),
    Bad("logit-bias-negative-key", chat(logit_bias={"-1": 5}), "'-1' is not a token id"),
    Bad("logit-bias-over-100", chat(logit_bias={"5": 101}), "from -100 to 100"),
    Bad("logit-bias-a-word", chat(logit_bias={"5": "up"}), "from -100 to 100"),
    Bad("logit-bias-beyond-vocabulary", chat(logit_bias={"999999": 1}), "not a token id of"),
    # Headers.
    Bad(
        "scenario-with-a-slash",
        chat(),
        "x-reef-scenario",
        headers={**JSON, "x-reef-scenario": "a/b"},
    ),
    Bad(
        "scenario-climbing",
        chat(),
        "x-reef-scenario",
        headers={**JSON, "x-reef-scenario": "../etc"},
    ),
    Bad(
        "scenario-too-long",
        chat(),
        "x-reef-scenario",
        headers={**JSON, "x-reef-scenario": "s" * 65},
    ),
    Bad(
        "session-too-long", chat(), "x-reef-session", headers={**JSON, "x-reef-session": "s" * 257}
    ),
    Bad(
        "text-plain-body",
        chat(),
        "Content-Type: application/json",
        415,
        {"content-type": "text/plain"},
    ),
    Bad(
        "form-body",
        chat(),
        "Content-Type",
        415,
        {"content-type": "application/x-www-form-urlencoded"},
    ),
    Bad("no-content-type", chat(), "the header is missing", 415, {}),
]


def assert_refused(response: httpx.Response, bad: Bad) -> None:
    assert response.status_code == bad.status, response.text
    error = response.json()["error"]
    assert bad.says in error["message"], error["message"]
    assert error["type"] and error["code"]


@pytest.mark.parametrize("bad", BAD_CHATS, ids=lambda bad: bad.name)
def test_bad_chat_requests_get_clear_errors(http: httpx.Client, bad: Bad) -> None:
    before = record_count(http)
    for payload in bad.payloads():
        response = http.post("/v1/chat/completions", content=payload, headers=bad.headers)
        assert_refused(response, bad)
    assert record_count(http) == before
    assert http.get("/reef/records", params={"order": "desc"}).status_code == 200
    assert http.post("/v1/chat/completions", json=chat()).status_code == 200


def report_count(http: httpx.Client) -> int:
    status = http.get("/reef/status").json()
    return sum(s["reports"] for s in status["store"]["scenarios"].values())


BAD_REPORTS = [
    Bad(
        "surrogate-feedback", {"references": ["rec_x"], "feedback": "\udfff"}, "feedback: a string"
    ),
    Bad(
        "deep-metadata",
        {"references": ["rec_x"], "score": 1, "metadata": json.loads("[" * 70 + "]" * 70)},
        "64 deep",
    ),
    Bad("references-a-string", {"references": "rec_x", "score": 1}, "references"),
    Bad("score-nan", '{"references": ["rec_x"], "score": NaN}', "finite"),
    Bad(
        "text-plain",
        {"references": ["rec_x"], "score": 1},
        "Content-Type",
        415,
        {"content-type": "text/plain"},
    ),
]


@pytest.mark.parametrize("bad", BAD_REPORTS, ids=lambda bad: bad.name)
def test_bad_reports_store_nothing(http: httpx.Client, bad: Bad) -> None:
    receipt = http.post("/v1/chat/completions", json=chat()).headers["x-reef-agent-record-id"]
    before = report_count(http)
    body = bad.payloads()[0].replace(b"rec_x", receipt.encode())
    assert_refused(http.post("/reef/report", content=body, headers=bad.headers), bad)
    assert report_count(http) == before
    assert http.get(f"/reef/records/{receipt}").json()["reports"] == []


# -- admin routes, on a server without tokens (every route open) -----------------------------

OPEN_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("open-server")
    write_config(folder, SMALL_ENGINE + f"server:\n  max_body_bytes: {OPEN_LIMIT}\n")
    with reef_serve(folder, free_port()).start() as server:
        yield server


CANDIDATE = "/reef/scenarios/default/candidates/cand_missing"
BODY_ROUTES = [
    "/v1/chat/completions",
    "/reef/report",
    "/reef/train",
    f"{CANDIDATE}/approve",
    f"{CANDIDATE}/reject",
    "/reef/scenarios/default/rollback",
]


def bytes_sent_before_an_answer(port: int, path: str, give_up_after: int) -> tuple[int, int]:
    """POST a chunked JSON body that does not end, until the server answers (or we give up).

    Returns the bytes sent by then and the answer's status (0 if none came). A server that reads
    a body whole before checking its size answers only once the body ends, which this never does.
    """
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b'{"reason": "' + b"x" * 65_000
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        while sent < give_up_after and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(framed)
            except OSError:  # the server answered and closed while we were sending
                break
            sent += len(chunk)
        answer = sock.recv(4096) if select.select([sock], [], [], 5)[0] else b""
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b"0"
    return sent, int(status)


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_every_body_is_refused_once_over_the_limit(open_server: ServerProcess, path: str) -> None:
    give_up_after = 64 * 1024 * 1024  # far beyond the limit plus what loopback buffers hold
    sent, status = bytes_sent_before_an_answer(open_server.port, path, give_up_after)
    assert status == 413
    assert sent < give_up_after


BAD_ADMIN_BODIES = [
    (f"{CANDIDATE}/approve", {"reason": 5}, "reason"),
    (f"{CANDIDATE}/approve", {"reason": "\ud800"}, "reason: a string holds a lone"),
    (f"{CANDIDATE}/approve", {"because": "x"}, "because: unknown key"),
    (f"{CANDIDATE}/reject", {}, "reason: required"),
    ("/reef/scenarios/default/rollback", {"to": 5}, "to"),
    ("/reef/scenarios/default/rollback", [1], "JSON object"),
]


@pytest.mark.parametrize(("path", "body", "says"), BAD_ADMIN_BODIES)
def test_bad_admin_bodies_get_clear_errors(
    open_server: ServerProcess, path: str, body: Any, says: str
) -> None:
    response = httpx.post(open_server.url + path, content=json.dumps(body), headers=JSON)
    assert_refused(response, Bad(path, body, says))


def test_admin_bodies_stay_optional(open_server: ServerProcess) -> None:
    response = httpx.post(f"{open_server.url}{CANDIDATE}/approve")
    assert response.status_code == 404 and "cand_missing" in response.json()["error"]["message"]


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
