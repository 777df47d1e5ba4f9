"""A candidate in shadow on a running `reef serve` (the real engine): it answers copies of live chat
calls on idle capacity, its answers are stored beside the live records and scored, and nobody
hears them: clients get the live answers, and the shadows make no records of their own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from reef.store import ExperienceStore
from reef.store.shadows import shadows_of
from reef.testing.artifacts import harness
from reef.testing.processes import free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, TOKEN, write_config

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = """\
gate:
  policy: review
  shadow: {scorer: {type: regex, pattern: "."}}
"""
WAIT_S = 120


def test_a_shadow_answers_copies_of_live_calls_and_is_never_heard(tmp_path: Path) -> None:
    write_config(tmp_path, SMALL_ENGINE + CONFIG)
    (tmp_path / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Hi"}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    (tmp_path / "evals" / "default.jsonl").write_text(json.dumps(task) + "\n")
    with reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        folder = harness(tmp_path / "terse", "Answer in one word.")
        run_reef(tmp_path, "release", "publish", str(folder), "--kind", "harness")
        held = json.loads(run_reef(tmp_path, "release", "candidates", "--json").stdout)[0]["id"]
        shadowed = run_reef(tmp_path, "release", "shadow", held, "--json")
        assert json.loads(shadowed.stdout)["state"] == "shadow", shadowed.stderr
        deadline = time.monotonic() + WAIT_S
        while held not in status(server.url)["shadows"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)

        receipts, answers = [], []
        for question in ("Name a colour.", "Name a fruit.", "Name an animal."):
            response = httpx.post(
                server.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": question}], "max_tokens": 12},
                headers=HEADERS,
                timeout=60,
            )
            response.raise_for_status()
            assert "x-reef-arm" not in response.headers  # a shadow is no arm: nobody is routed
            receipts.append(response.headers["x-reef-agent-record-id"])
            answers.append(response.json())
            time.sleep(0.3)  # the idle time between a user's calls, when shadows run
        while status(server.url)["shadows"][held]["answered"] < len(receipts):
            assert time.monotonic() < deadline, status(server.url)["shadows"]
            time.sleep(0.2)
        records = httpx.get(server.url + "/reef/records", headers=HEADERS).json()["data"]

    assert sorted(r["id"] for r in records) == sorted(receipts)  # shadows made no records
    with ExperienceStore(tmp_path / ".reef" / "experience.db") as store:
        shadows = shadows_of(store, held)
    assert sorted(s["live_record_id"] for s in shadows) == sorted(receipts)
    live_by_id = dict(zip(receipts, answers, strict=True))
    for shadow in shadows:
        live = live_by_id[shadow["live_record_id"]]
        # Under its own harness: its system prompt, not the model's default one the live call had.
        shown = shadow["response"]["usage"]["prompt_tokens"]
        assert shown != live["usage"]["prompt_tokens"]
        # Each side scored by the scenario's scorer (any character: 1, an empty answer: 0).
        said = [
            live["choices"][0]["message"]["content"],
            shadow["response"]["choices"][0]["message"]["content"],
        ]
        assert [shadow["live_score"], shadow["shadow_score"]] == [float(bool(t)) for t in said]


def status(url: str) -> dict:
    return httpx.get(url + "/reef/status", headers=HEADERS).json()
