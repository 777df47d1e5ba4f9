"""A fresh `reef init` project gates a harness on its own eval tasks, on the real embedded model.

The project's eval tasks ask for short, right answers, at the gate's settings (temperature 0,
seed 0). Publishing the quickstart's one-line harness ("Answer in one short sentence.") runs every
task on both sides, in order, and the default `no_regression` policy decides from the scores it
stored: released when the harness passes more and loses none of the tasks the base passes,
rejected otherwise, naming the tasks it lost. Which one it is depends on what the
model answers on this machine, so the test holds the decision to the scores, not to an outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reef.evaluation.intervals import worse_beyond_noise
from reef.evaluation.tasks import load_tasks
from reef.testing.processes import run_reef

HARNESS = "Answer in one short sentence.\n"


def test_a_fresh_projects_gate_decides_on_its_own_tasks(tmp_path: Path) -> None:
    project = tmp_path / "project"
    created = run_reef(tmp_path, "init", str(project))
    assert created.returncode == 0, created.stdout + created.stderr
    gate = yaml.safe_load((project / "reef.yaml").read_text())["gate"]
    assert (gate["policy"], gate["temperature"], gate["samples"]) == ("no_regression", None, 8)
    tasks = load_tasks(project / "evals/default.jsonl")
    assert len(tasks) >= 5

    harness = project / "short-answers"
    harness.mkdir()
    (harness / "AGENTS.md").write_text(HARNESS)
    published = run_reef(
        project, "release", "publish", "short-answers", "--kind", "harness", "--json", timeout=900
    )
    assert published.returncode in (0, 1), published.stdout + published.stderr  # 1: rejected
    candidate = json.loads(published.stdout)
    evaluation = candidate["evaluation"]
    assert [result["task_id"] for result in evaluation["results"]] == [t.id for t in tasks]
    results = evaluation["results"]
    assert evaluation["current_release_id"] == "base"
    assert all(len(r["candidate_scores"]) == 8 for r in results)  # sampled, as served
    assert all(
        0.0 <= r["current_score"] <= 1.0 and 0.0 <= r["candidate_score"] <= 1.0 for r in results
    )
    current = sum(r["current_score"] for r in results) / len(results)
    better = sum(r["candidate_score"] for r in results) / len(results)
    assert (evaluation["current_mean"], evaluation["candidate_mean"]) == (
        pytest.approx(current, abs=1e-4),
        pytest.approx(better, abs=1e-4),
    )
    # Lost only beyond the noise of each task's samples (reef.evaluation.runner.TaskResult.lost).
    lost = [
        r["task_id"]
        for r in results
        if worse_beyond_noise(
            sum(s >= 0.5 for s in r["current_scores"]),
            sum(s >= 0.5 for s in r["candidate_scores"]),
            8,
        )
    ]
    assert evaluation["lost"] == lost
    if candidate["state"] == "released":
        assert better > current and not lost, candidate["decision"]
        assert candidate["release_id"] == "default@1" and published.returncode == 0
    else:
        assert candidate["state"] == "rejected" and candidate["release_id"] is None
        assert published.returncode == 1
        assert all(task in candidate["decision"] for task in lost), candidate["decision"]
        why = ("does not beat current", "falls below the bar")
        assert lost or better <= current or any(w in candidate["decision"] for w in why)
