"""The real server on the embedded model, driven by the real `openai` client and plain HTTP."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI

from reef.testing.processes import ServerProcess
from tests.conftest import BODY_LIMIT, ROTATED_TOKEN, TOKEN

HI = [{"role": "user", "content": "Say hi."}]


def record_count(http: httpx.Client) -> int:
    status = http.get("/reef/status").json()
    return sum(s["records"] for s in status["store"]["scenarios"].values())


def test_whole_response_carries_receipt_and_release(client: OpenAI, http: httpx.Client) -> None:
    raw = client.chat.completions.with_raw_response.create(model="any", messages=HI, max_tokens=8)
    completion = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    assert raw.headers["x-reef-release-id"] == "base"
    assert completion.choices[0].message.role == "assistant"
    assert completion.usage is not None and completion.usage.completion_tokens <= 8

    record = http.get(f"/reef/records/{receipt}").json()
    assert record["id"] == receipt
    assert record["request"]["messages"] == HI
    assert (
        record["response"]["choices"][0]["message"]["content"]
        == completion.choices[0].message.content
    )
    assert record["engine"] == "llamacpp" and record["release_id"] == "base"
    assert len(record["completion_token_ids"]) == completion.usage.completion_tokens
    assert len(record["completion_logprobs"]) == completion.usage.completion_tokens
    assert record["latency_ms"] > 0 and record["ttft_ms"] > 0
    assert record["stream"] is False


def test_stream_ends_with_the_receipt_chunk(client: OpenAI, http: httpx.Client) -> None:
    chunks = list(
        client.chat.completions.create(model="any", messages=HI, max_tokens=8, stream=True)
    )
    last = chunks[-1]
    assert last.choices == []
    receipt = last.model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    record = http.get(f"/reef/records/{receipt}").json()
    assert record["stream"] is True
    assert record["response"]["choices"][0]["message"]["content"] == text
    assert record["completion_token_ids"]


def test_stream_over_raw_http_has_release_header_and_done(http: httpx.Client) -> None:
    body = {"messages": HI, "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["x-reef-release-id"] == "base"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["reef"]["agent_record_id"].startswith(
        "rec_"
    )


def test_report_against_receipts_and_read_it_back(client: OpenAI, http: httpx.Client) -> None:
    receipts = [
        client.chat.completions.with_raw_response.create(
            model="m", messages=HI, max_tokens=4
        ).headers["x-reef-agent-record-id"]
        for _ in range(2)
    ]
    response = http.post(
        "/reef/report",
        json={
            "references": receipts,
            "score": 0.25,
            "feedback": "too short",
            "metadata": {"by": "t"},
        },
    )
    assert response.status_code == 201
    report = response.json()
    assert report["references"] == receipts and report["score"] == 0.25
    for receipt in receipts:
        reports = http.get(f"/reef/records/{receipt}").json()["reports"]
        assert [(r["score"], r["feedback"]) for r in reports] == [(0.25, "too short")]
    listed = http.get("/reef/records", params={"limit": 2, "order": "desc"}).json()["data"]
    assert {r["id"] for r in listed} == set(receipts)
    assert all(r["reports"][0]["id"] == report["id"] for r in listed)


def test_report_id_makes_reports_idempotent(client: OpenAI, http: httpx.Client) -> None:
    receipt = client.chat.completions.with_raw_response.create(
        model="m", messages=HI, max_tokens=2
    ).headers["x-reef-agent-record-id"]
    body: dict[str, Any] = {
        "references": [receipt],
        "score": 1,
        "report_id": f"r-{uuid.uuid4().hex}",
    }
    first = http.post("/reef/report", json=body)
    again = http.post("/reef/report", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    changed = http.post("/reef/report", json={**body, "score": 0})
    assert changed.status_code == 409
    assert "report_id" in changed.json()["error"]["message"]


def test_scenario_and_session_headers_are_recorded(client: OpenAI, http: httpx.Client) -> None:
    headers = {"x-reef-scenario": "support", "x-reef-session": "conv-1"}
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=HI, max_tokens=2, extra_headers=headers
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    record = http.get(f"/reef/records/{receipt}").json()
    assert (record["scenario"], record["session"]) == ("support", "conv-1")
    in_scenario = http.get("/reef/records", params={"scenario": "support"}).json()["data"]
    assert receipt in {r["id"] for r in in_scenario}
    # Feedback must name the scenario its records belong to.
    wrong = http.post("/reef/report", json={"references": [receipt], "score": 1})
    assert wrong.status_code == 404
    assert receipt in wrong.json()["error"]["message"]
    assert "scenario 'default'" in wrong.json()["error"]["message"]
    right = http.post(
        "/reef/report",
        json={"references": [receipt], "score": 1},
        headers={"x-reef-scenario": "support"},
    )
    assert right.status_code == 201


def test_capture_false_serves_without_recording(client: OpenAI, http: httpx.Client) -> None:
    before = record_count(http)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=HI, max_tokens=2, extra_headers={"x-reef-capture": "false"}
    )
    assert raw.parse().choices[0].message.role == "assistant"
    assert "x-reef-agent-record-id" not in raw.headers
    assert record_count(http) == before


def test_logprobs_are_returned_only_when_asked(client: OpenAI) -> None:
    plain = client.chat.completions.create(model="m", messages=HI, max_tokens=3)
    assert plain.choices[0].logprobs is None
    asked = client.chat.completions.create(
        model="m", messages=HI, max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = asked.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content[0].top_logprobs) == 2


def test_agent_shaped_request_is_accepted(client: OpenAI) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    completion = client.chat.completions.create(
        model="m",
        messages=[
            {"role": "developer", "content": "You are a coding agent."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Read"}, {"type": "text", "text": "x.py"}],
            },
        ],
        tools=[tool],  # type: ignore[list-item]
        stop=["\n\n"],
        seed=5,
        max_completion_tokens=6,
    )
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct.Q4_1"]


def test_status_reports_engine_and_counts(http: httpx.Client) -> None:
    status = http.get("/reef/status").json()
    assert status["engine"]["name"] == "llamacpp"
    assert status["engine"]["token_ids"] is True
    assert status["uptime_s"] > 0
    assert status["store"]["size_bytes"] > 0


# -- auth ---------------------------------------------------------------------------------


def test_every_route_but_healthz_needs_a_token(llama_server: ServerProcess) -> None:
    assert httpx.get(llama_server.url + "/healthz").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/reef/report"),
        ("GET", "/reef/records"),
        ("GET", "/reef/status"),
    ]:
        response = httpx.request(method, llama_server.url + path, json={})
        assert response.status_code == 401, path
        assert "Authorization: Bearer" in response.json()["error"]["message"]


def test_a_wrong_token_is_refused_and_rotated_tokens_both_work(llama_server: ServerProcess) -> None:
    def status_with(token: str) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(llama_server.url + "/reef/status", headers=headers).status_code

    assert status_with("wrong") == 401
    assert status_with(TOKEN[:-1]) == 401
    assert status_with(TOKEN) == 200
    assert status_with(ROTATED_TOKEN) == 200


def test_openai_client_with_a_wrong_key_gets_an_authentication_error(
    llama_server: ServerProcess,
) -> None:
    import openai

    bad = OpenAI(base_url=llama_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=HI, max_tokens=2)  # type: ignore[arg-type]


# -- bad input (the corpus of bad requests is in test_bad_requests.py) ----------------------


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    big = {"messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}
    response = http.post("/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]["message"]


BAD_REPORTS = [
    ({"references": ["rec_nope"], "score": 1}, 404, "unknown record"),
    ({"references": ["rec_x"], "score": True}, 400, "score must be a number"),
    ({"references": ["rec_x"], "score": "high"}, 400, "score must be a number"),
    ({"references": ["rec_x"]}, 400, "send a score, a feedback, or both"),
    ({"references": ["rec_x"], "score": 1, "colour": "red"}, 400, "colour: unknown key"),
    ({"references": ["rec_x"], "score": 1, "report_id": "a/b"}, 400, "report_id"),
    ({"references": ["rec_x"], "score": 1, "report_id": "r-1\n"}, 400, "report_id"),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD_REPORTS)
def test_bad_reports_get_clear_errors(
    http: httpx.Client, body: dict[str, Any], status: int, says: str
) -> None:
    response = http.post("/reef/report", json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_scores_are_refused(http: httpx.Client, literal: str) -> None:
    body = '{"references": ["rec_x"], "score": ' + literal + "}"
    response = http.post("/reef/report", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "finite" in response.json()["error"]["message"]


def test_names_with_a_trailing_newline_are_refused(http: httpx.Client) -> None:
    """Names are matched whole: a `$`-anchored match let `default\n` through."""
    releases = http.get("/reef/scenarios/default%0A/releases")
    assert releases.status_code == 404, releases.text
    harness = http.get("/reef/harness", params={"scenario": "default\n"})
    assert harness.status_code == 400, harness.text
    assert "not a valid scenario name" in harness.json()["error"]["message"]
    body = {"messages": HI, "max_tokens": 1, "logit_bias": {"42\n": 1}}
    chat = http.post("/v1/chat/completions", json=body)
    assert chat.status_code == 400, chat.text
    assert "is not a token id" in chat.json()["error"]["message"]


def test_unknown_record_and_route_are_json_404s(http: httpx.Client) -> None:
    record = http.get("/reef/records/rec_missing")
    assert record.status_code == 404 and "receipt" in record.json()["error"]["message"]
    route = http.get("/v1/nothing-here")
    assert route.status_code == 404 and "no route" in route.json()["error"]["message"]
    assert http.get("/reef/records", params={"limit": "lots"}).status_code == 400
    assert http.get("/reef/records", params={"after": "rec_missing"}).status_code == 404


def test_tokens_never_reach_the_log_or_the_records(
    llama_server: ServerProcess, http: httpx.Client
) -> None:
    records = http.get("/reef/records", params={"limit": 1000}).json()["data"]
    assert records
    stored = json.dumps(records)
    log = llama_server.log()
    for secret in (TOKEN, ROTATED_TOKEN):
        assert secret not in stored
        assert secret not in log
