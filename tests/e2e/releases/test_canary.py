"""Canaries on a running `reef serve` (the real engine and model): a held candidate on a share of
sessions, judged on their reports against the release it would replace, rolled back or promoted
by the server with no one asking; and a routing policy that cannot route is never released.

The two harnesses differ in a way no sampling can blur: the stable one lets an answer run to 6
tokens, the broken one to 1 (requests ban the end-of-sequence token, so every answer runs to
its cap), and the scripted user scores an answer by its length."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from reef.releases.chain import ReleaseChain
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, TOKEN, write_config

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
EOS = 2  # SmolLM2's <|im_end|>
CANARY = """\
gate:
  policy: review
  canary: {min_reports: 6, margin: 0.2, confidence: 0.9, check_s: 0.3, deadline_s: 300}
"""
DEADLINE_S = 120


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_config(tmp_path, SMALL_ENGINE + CANARY)
    (tmp_path / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Hi"}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    (tmp_path / "evals" / "default.jsonl").write_text(json.dumps(task) + "\n")
    return tmp_path


def reef(project: Path, *args: str) -> str:
    result = run_reef(project, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def held(project: Path, folder: Path) -> str:
    """Publish `folder` as a harness candidate, held for review; its id."""
    reef(project, "release", "publish", str(folder), "--kind", "harness")
    found = json.loads(reef(project, "release", "candidates", "--state", "held", "--json"))
    return found[0]["id"]


def status(server: ServerProcess) -> dict:
    return httpx.get(server.url + "/reef/status", headers=HEADERS).json()


def candidate_row(server: ServerProcess, candidate: str) -> dict:
    """The candidate as `reef release candidates --json` shows it, read over HTTP: a CLI process
    per call would cost a second each, dozens of times a canary."""
    url = f"{server.url}/reef/scenarios/default/candidates"
    shown = httpx.get(url, headers=HEADERS, timeout=30).json()["data"]
    return next(c for c in shown if c["id"] == candidate)


def until_serving(server: ServerProcess, release_id: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while status(server)["serving"].get("default") != release_id:
        assert time.monotonic() < deadline, f"{release_id} did not serve"
        time.sleep(0.1)


def traffic_until_decided(server: ServerProcess, project: Path, candidate: str) -> dict:
    """One call per new session, each reported (1 for an answer of two tokens or more), until
    the candidate's canary ends; the arm each session took, and the candidate."""
    arms: dict[str, set[str]] = {}
    deadline = time.monotonic() + DEADLINE_S
    n = 0
    while time.monotonic() < deadline:
        session = f"user-{candidate[-6:]}-{n}"
        for _ in range(2):  # a session's second call takes the arm its first did
            answer = httpx.post(
                server.url + "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "Say hi."}],
                    "temperature": 0,
                    "logit_bias": {str(EOS): -100},
                },
                headers={**HEADERS, "x-reef-session": session},
                timeout=60,
            )
            answer.raise_for_status()
            arms.setdefault(session, set()).add(answer.headers.get("x-reef-arm", "none"))
        score = 1.0 if answer.json()["usage"]["completion_tokens"] >= 2 else 0.0
        report = {"references": [answer.headers["x-reef-agent-record-id"]], "score": score}
        httpx.post(server.url + "/reef/report", json=report, headers=HEADERS).raise_for_status()
        n += 1
        mine = candidate_row(server, candidate)
        if mine["state"] != "canary":
            return {"arms": arms, "candidate": mine}
    raise AssertionError(f"the canary of {candidate} was not decided in {DEADLINE_S} s")


def test_a_canary_rolls_a_worse_candidate_back_and_promotes_a_good_one(project: Path) -> None:
    with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        stable = harness(project / "stable", "Be kind.", {"max_tokens": 6})
        reef(project, "release", "publish", str(stable), "--kind", "harness", "--approve")
        broken = held(project, harness(project / "broken", "Be kind.", {"max_tokens": 1}))

        started = json.loads(reef(project, "release", "canary", broken, "--share", "50", "--json"))
        assert started["state"] == "canary" and started["release_id"] == "default@2"
        until_serving(server, "default@2")
        routed = status(server)["routing"]["default"]
        assert [(a["name"], a["share"], a["release"]) for a in routed["routes"][0]["arms"]] == [
            ("stable", 50, "default@1"),
            ("canary", 50, "default@2"),
        ]
        seen = traffic_until_decided(server, project, broken)
        assert seen["candidate"]["state"] == "rejected"
        assert "worse, rolled back" in seen["candidate"]["decision"]
        # Sessions are sticky: a session's routed calls take one arm. The session under way when
        # the judge decides has its next call unrouted ("none"), whatever arm it had.
        routed_arms = [arms - {"none"} for arms in seen["arms"].values()]
        assert all(len(arms) <= 1 for arms in routed_arms), seen["arms"]
        assert {arm for arms in routed_arms for arm in arms} == {"stable", "canary"}
        chain = ReleaseChain(project / ".reef" / "releases.git")
        rolled = chain.head("default")
        assert rolled is not None and rolled.release_id == "default@3"
        assert chain.files("default@3") == chain.files("default@1")  # no policy, stable's files

        good = held(project, harness(project / "good", "Be warm.", {"max_tokens": 6}))
        reef(project, "release", "canary", good, "--share", "50")
        until_serving(server, "default@4")
        decided = traffic_until_decided(server, project, good)["candidate"]
        assert decided["state"] == "released" and "not worse, promoted" in decided["decision"]
        promoted = chain.head("default")
        assert promoted is not None and promoted.release_id == decided["release_id"] == "default@5"
        assert "routing" not in promoted.carried_parts
        assert chain.files("default@5")["AGENTS.md"] == b"Be warm.\n"

        # Every routed record says which policy routed it and which arm it took.
        records = httpx.get(server.url + "/reef/records?limit=500", headers=HEADERS).json()["data"]
        routed_records = [r for r in records if r.get("routing_release_id") == "default@2"]
        assert {r["arm"] for r in routed_records} == {"stable", "canary"}
        assert {r["release_id"] for r in routed_records if r["arm"] == "canary"} == {"default@2"}


def test_a_routing_policy_on_a_release_that_does_not_exist_is_a_rejected_candidate(
    project: Path,
) -> None:
    folder = harness(project / "routed", "Be kind.")
    (folder / "routing.yaml").write_text(
        "routes:\n  - arms:\n      - {name: old, release: default@7, share: 100}\n"
    )
    result = run_reef(project, "release", "publish", str(folder), "--kind", "harness")
    assert result.returncode != 0
    assert "routing.yaml line 3: arm 'old': there is no release 'default@7'" in (
        result.stdout + result.stderr
    )
    assert ReleaseChain(project / ".reef" / "releases.git").head("default") is None
