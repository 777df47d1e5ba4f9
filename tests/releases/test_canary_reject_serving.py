"""A canary rejected by a human (`reef release reject`, another process) stops serving: once the
server follows the moved head, every session, sent together from real concurrent connections,
is answered by what served before the canary. Reef served in the test's process; the scripted
engine says which tree answered (the candidate's AGENTS.md is in the prompt it reads)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx

from reef.protocol import ChatRequest, message_text
from reef.testing.in_process import reef_in_process
from reef.testing.processes import run_reef
from reef.testing.scripted_engine import ScriptedEngine
from tests.support.waiting import release_serving, until

SESSIONS = 12


def by_tree(request: ChatRequest) -> str:
    said = " ".join(message_text(m.content) for m in request.messages)
    return "canary" if "CANARY" in said else "stable"


def sessions_together(url: str, round_name: str) -> Counter[tuple[str, str]]:
    """One call per session, all released at once: (answer, release) counted."""
    barrier = threading.Barrier(SESSIONS)
    seen: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def call(number: int) -> None:
        headers = {"x-reef-session": f"{round_name}-{number}"}
        body = {"messages": [{"role": "user", "content": "Hi"}]}
        with httpx.Client(timeout=30) as client:
            barrier.wait()
            answered = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        text = answered.json()["choices"][0]["message"]["content"]
        with lock:
            seen[text, answered.headers["x-reef-release-id"]] += 1

    threads = [threading.Thread(target=call, args=(n,)) for n in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return seen


def test_after_a_reject_no_session_is_served_by_the_canary(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\n")
    with reef_in_process(tmp_path, ScriptedEngine(by_tree)) as server:
        workflow = server.state.workflow
        stable = workflow.propose("default", "harness", {"AGENTS.md": b"You are stable."})
        assert workflow.approve(stable.id, force=True).release_id == "default@1"
        candidate = workflow.propose("default", "harness", {"AGENTS.md": b"You are CANARY."})
        on_canary = workflow.canaries.start(candidate.id, 50)
        until(lambda: release_serving(server.url) == on_canary.release_id)
        during = sessions_together(server.url, "during")
        assert {answer for answer, _ in during} == {"canary", "stable"}  # both arms serve

        # Rejected as the newcomer did, from the CLI in another process: the server follows.
        rejected = run_reef(
            tmp_path, "release", "reject", candidate.id, "--reason", "it answers in capitals"
        )
        assert rejected.returncode == 0, rejected.stdout + rejected.stderr
        until(lambda: release_serving(server.url) not in (None, on_canary.release_id))
        rolled_back = release_serving(server.url)
        after = sessions_together(server.url, "during")  # the very sessions, and new ones
        after += sessions_together(server.url, "after")
    assert after == {("stable", rolled_back): 2 * SESSIONS}, after
