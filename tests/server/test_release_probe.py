"""After a swap, the release answers its own gate tasks as the gate judged, or it is flagged
(`reef.daemon.release_probe`, issue 70).

The gate's answers come from one scripted engine, the live ones from the server's: when both
answer alike the release serves as judged; when the server's engine answers otherwise under the
release (as an engine that dropped the release's adapter would), `/reef/status` names the
mismatch, `/metrics` says 1, and the swap is logged as suspect."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

from reef.evaluation.runner import model_generate
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest
from reef.testing.in_process import InProcessReef, reef_in_process
from reef.testing.scripted_engine import ScriptedEngine
from tests.support.waiting import until

TASKS = [
    {
        "id": f"say-{word}",
        "messages": [{"role": "user", "content": f"Say {word}."}],
        "scorer": {"type": "contains", "value": word},
    }
    for word in ("red", "blue", "green", "gold")
]


def judged_script(request: ChatRequest) -> str:
    """Under the harness (its system prompt) the word asked for; without it, something else."""
    system = request.messages[0].text() if request.messages[0].role == "system" else ""
    asked = request.messages[-1].text().removeprefix("Say ").rstrip(".")
    return asked if "Name the colour" in system else "I cannot say."


def dropped_script(request: ChatRequest) -> str:
    """An engine that serves the release without what made it (here: its system prompt)."""
    return "I cannot say."


def project(folder: Path) -> None:
    (folder / "evals").mkdir()
    (folder / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (folder / "reef.yaml").write_text("releases:\n  probe_tasks: 3\n")


def gate_and_release(server: InProcessReef) -> str:
    """Gate a harness candidate with the judged script (as the learner's gate would answer)."""
    workflow = server.state.workflow
    candidate = workflow.propose("default", "harness", {"AGENTS.md": b"Name the colour.\n"})
    generate = model_generate(
        LocalModel(ScriptedEngine(judged_script)), workflow.eval_settings("default")
    )
    gated = asyncio.run(workflow.gate(candidate, generate))
    assert gated.state == "released", gated.decision
    assert gated.release_id is not None
    return gated.release_id


def status(server: InProcessReef) -> dict:
    return httpx.get(f"{server.url}/reef/status").json()


def mismatch_metric(server: InProcessReef) -> str:
    text = httpx.get(f"{server.url}/metrics").text
    return next(line for line in text.splitlines() if line.startswith("reef:release_mismatch{"))


def test_a_release_that_serves_as_judged_is_not_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    project(tmp_path)
    caplog.set_level(logging.INFO, logger="reef.releases")
    engine = ScriptedEngine(judged_script)
    with reef_in_process(tmp_path, engine) as server:
        released = gate_and_release(server)
        until(lambda: "serves default@1 as judged" in caplog.text)
        assert released == "default@1"
        assert status(server)["release_mismatch"] == {}
        assert mismatch_metric(server).endswith(" 0.0")
        probed = [c for c in engine.calls if c.request.messages[0].role == "system"]
        assert len(probed) == 3  # releases.probe_tasks of the release's own gate tasks


def test_a_release_that_answers_otherwise_than_judged_is_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    project(tmp_path)
    caplog.set_level(logging.INFO, logger="reef.releases")
    with reef_in_process(tmp_path, ScriptedEngine(dropped_script)) as server:
        gate_and_release(server)
        until(lambda: "default" in status(server)["release_mismatch"])
        found = status(server)["release_mismatch"]["default"]
        assert found["release_id"] == "default@1"
        assert found["probed"] == 3 and found["mismatched"] == 3
        assert found["examples"][0]["judged"] == "red"
        assert found["examples"][0]["served"] == "I cannot say."
        assert mismatch_metric(server).endswith(" 1.0")
        assert "the swap to default@1 is suspect" in caplog.text
