"""`reef records`, the real CLI in a subprocess against Reef served in the test's process (a
scripted engine): at 80 columns every record is whole enough to read, and no column is empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from reef.testing.in_process import reef_in_process
from reef.testing.scripted_engine import ScriptedEngine

PROMPT = "What is the capital of France, and why is it famous?"


def records(url: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "REEF_URL": url}
    result = subprocess.run(
        [sys.executable, "-m", "reef", "records"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


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
