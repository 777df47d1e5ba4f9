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


def test_a_score_outside_the_declared_range_is_stored_and_said(tmp_path: Path) -> None:
    with reef_in_process(tmp_path) as server:
        answered = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": PROMPT}]},
        )
        record_id = answered.headers["x-reef-agent-record-id"]
        outside = reef(server.url, "report", record_id, "--score", "5", columns=200)
        inside = reef(server.url, "report", record_id, "--score", "1", columns=200)
    assert "reported" in outside and "score 5 is outside default's score range [0, 1]" in outside
    assert "a canary reads it as 1" in outside
    assert "reported" in inside and "outside" not in inside
