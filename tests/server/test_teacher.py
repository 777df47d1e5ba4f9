"""A teacher behind the student on Reef served in the test's process (the student a scripted
engine; the teacher the loopback OpenAI peer, which answers `echo: <the question>`): a call
whose answer fails the
scenario's check is answered by the teacher, recorded as its answer with a demonstration the
weight recipes learn from; a share of sessions goes to it outright; a teacher that cannot answer
leaves the student's answer; its key comes from the environment and is never stored."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from reef.testing.in_process import InProcessReef, reef_in_process
from reef.testing.processes import ServerProcess, free_port
from tests.conftest import TOKEN, peer, write_config

__all__ = ["peer"]  # the loopback OpenAI peer fixture
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
TEACHER_KEY = "sk-teacher-secret-31"
# Only the teacher says exactly this: the student never echoes the question back in this form.
EXACT_ECHO = "^echo: Say hi\\.$"


def ask(server: InProcessReef, session: str | None = None) -> httpx.Response:
    headers = {**HEADERS, **({"x-reef-session": session} if session else {})}
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    response = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    response.raise_for_status()
    return response


def get(server: InProcessReef, path: str) -> dict:
    return httpx.get(server.url + path, headers=HEADERS).json()


def test_an_answer_that_fails_the_check_is_the_teachers_and_a_demonstration(
    tmp_path: Path,
    peer: ServerProcess,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_config(
        tmp_path,
        f"teacher:\n  url: {peer.url}/v1\n  api_key_env: TEACHER_KEY\n"
        + f"  scorer: {{type: regex, pattern: '{EXACT_ECHO}'}}\n",
    )
    monkeypatch.setenv("TEACHER_KEY", TEACHER_KEY)  # the teacher reads its key as it starts
    caplog.set_level(logging.DEBUG)
    with reef_in_process(tmp_path, env={"REEF_TOKEN": TOKEN}) as server:
        response = ask(server)
        assert response.json()["choices"][0]["message"]["content"] == "echo: Say hi."
        assert response.headers["x-reef-arm"] == "teacher"
        seen = httpx.get(peer.url + "/peer/last").json()
        assert seen["authorization"] == f"Bearer {TEACHER_KEY}"
        record = get(server, f"/reef/records/{response.headers['x-reef-agent-record-id']}")
        costs = get(server, "/reef/status")["teachers"]["default"]
    log = caplog.text
    assert (record["engine"], record["arm"]) == ("teacher", "teacher")
    (report,) = record["reports"]
    assert report["feedback"] == {"demonstration": "echo: Say hi."}
    assert report["metadata"] == {"source": "teacher", "reason": "scorer"}
    assert costs["calls"] == 1 and costs["by_reason"] == {"scorer": 1}
    assert costs["share_of_calls"] == 1.0 and costs["completion_tokens"] > 0
    assert TEACHER_KEY not in log
    assert TEACHER_KEY not in (tmp_path / ".reef" / "experience.db").read_bytes().decode("latin-1")


def test_a_share_of_sessions_goes_to_the_teacher_outright_and_stays(
    tmp_path: Path, peer: ServerProcess
) -> None:
    write_config(tmp_path, f"teacher:\n  url: {peer.url}/v1\n  share: 50\n")
    with reef_in_process(tmp_path, env={"REEF_TOKEN": TOKEN}) as server:
        arms = {}
        for n in range(12):
            session = f"s{n}"
            first, second = ask(server, session), ask(server, session)
            arms[session] = {first.headers.get("x-reef-arm"), second.headers.get("x-reef-arm")}
        costs = get(server, "/reef/status")["teachers"]["default"]
    assert all(len(seen) == 1 for seen in arms.values())  # a session keeps its side
    taught = [s for s, seen in arms.items() if seen == {"teacher"}]
    assert 0 < len(taught) < 12
    assert costs["by_reason"] == {"share": 2 * len(taught)}


def test_a_teacher_that_cannot_answer_leaves_the_students_answer(tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    write_config(tmp_path, f"teacher:\n  url: {gone}\n  share: 100\n")
    with reef_in_process(tmp_path, env={"REEF_TOKEN": TOKEN}) as server:
        response = ask(server, "s1")
        costs = get(server, "/reef/status")["teachers"]["default"]
    assert "x-reef-arm" not in response.headers
    assert response.json()["choices"][0]["message"]["content"]  # the student answered
    assert costs["failures"] == 1 and costs["calls"] == 0


def test_a_check_that_cannot_decide_leaves_the_students_answer_and_names_no_url(
    tmp_path: Path, peer: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # The judge's URL carries a password, and nothing listens there.
    judge = f"http://judge:judge-secret-7@127.0.0.1:{free_port()}/v1"
    scorer = f"{{type: judge, url: '{judge}', criterion: 'says hi'}}"
    write_config(tmp_path, f"teacher:\n  url: {peer.url}/v1\n  scorer: {scorer}\n")
    caplog.set_level(logging.DEBUG)
    with reef_in_process(tmp_path, env={"REEF_TOKEN": TOKEN}) as server:
        response = ask(server)  # raises for a status other than 2xx
        costs = get(server, "/reef/status")["teachers"]["default"]
    log = caplog.text
    assert "x-reef-arm" not in response.headers  # the student's answer, not the teacher's
    assert response.json()["choices"][0]["message"]["content"]
    assert costs["undecided"] == 1 and costs["calls"] == 0
    assert "judge-secret-7" not in log and "judge-secret-7" not in response.text
