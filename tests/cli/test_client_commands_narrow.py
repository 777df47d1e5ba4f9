"""`reef records` and `reef report`, the real CLI in a subprocess against Reef served in the
test's process (a scripted engine): at 80 columns every record is whole enough to read, no
column is empty, and a score outside the scenario's declared range is said to be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from reef.testing.in_process import reef_in_process
from reef.testing.scripted_engine import ScriptedEngine

PROMPT = "What is the capital of France, and why is it famous?"


def reef(url: str, *args: str, columns: int = 80) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "REEF_URL": url}
    result = subprocess.run(
        [sys.executable, "-m", "reef", *args], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def records(url: str, columns: int) -> str:
    return reef(url, "records", columns=columns)


def test_records_fit_a_narrow_terminal_and_show_no_empty_column(tmp_path: Path) -> None:
    with reef_in_process(tmp_path, ScriptedEngine("Paris. It is famous for its tower.")) as server:
        answered = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": PROMPT}]},
        )
        record_id = answered.headers["x-reef-agent-record-id"]
        httpx.post(
            f"{server.url}/reef/report",
            json={"references": [record_id], "score": 0, "feedback": "Add: Cheers"},
        ).raise_for_status()
        narrow, wide = records(server.url, 80), records(server.url, 160)
    assert record_id in narrow and "prompt: What is the capital of France" in narrow
    assert "feedback: 0 Add: Cheers" in narrow
    assert all(len(line) <= 80 for line in narrow.splitlines())
    assert record_id in wide and "prompt" in wide and "What is the capital" in wide
    for shown in (narrow, wide):  # one scenario, and no recipe concluded anything
        assert "learned as" not in shown and "scenario" not in shown


def test_a_score_outside_the_declared_range_is_refused_or_clamped_when_asked(
    tmp_path: Path,
) -> None:
    """A score of 5 on a 0-to-1 scenario would skew every pass rate that reads it: refused,
    naming the range and the ways on; `--clamp` stores it at the edge, saying so."""
    with reef_in_process(tmp_path) as server:
        answered = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": PROMPT}]},
        )
        record_id = answered.headers["x-reef-agent-record-id"]
        refused = httpx.post(
            f"{server.url}/reef/report", json={"references": [record_id], "score": 5}
        )
        clamped = reef(server.url, "report", record_id, "--score", "5", "--clamp", columns=200)
        inside = reef(server.url, "report", record_id, "--score", "1", columns=200)
        scores = [
            r["score"]
            for r in httpx.get(f"{server.url}/reef/records/{record_id}").json()["reports"]
        ]
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "score_out_of_range"
    assert "score 5 is outside default's score range [0, 1]" in error["message"]
    assert (
        "reef report --clamp" in error["message"] and "gate.canary.score_range" in error["message"]
    )
    assert "reported" in clamped and "score 5 is outside [0, 1]: stored as 1" in clamped
    assert "reported" in inside and "outside" not in inside
    assert scores == [1.0, 1.0]  # nothing of the refused report was stored
