"""A fresh `reef init` project can release a better harness through its own gate.

The project's eval tasks ask for short, right answers. On the real embedded model, at the gate's
settings (temperature 0, seed 0), the base model fails some of them, and the one-line harness of
the quickstart ("Answer in one short sentence.") passes more, so the default `improve` policy
releases it. Before, the only task was one the base model already passed: no harness could ever
beat it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reef.evaluation.tasks import load_tasks
from reef.testing.processes import run_reef

HARNESS = "Answer in one short sentence.\n"


@pytest.mark.slow
def test_a_fresh_projects_gate_releases_a_harness_that_passes_more_tasks(tmp_path: Path) -> None:
    project = tmp_path / "project"
    created = run_reef(tmp_path, "init", str(project))
    assert created.returncode == 0, created.stdout + created.stderr
    gate = yaml.safe_load((project / "reef.yaml").read_text())["gate"]
    assert (gate["policy"], gate["temperature"], gate["seed"]) == ("improve", 0.0, 0)
    tasks = load_tasks(project / "evals/default.jsonl")
    assert len(tasks) >= 5

    harness = project / "short-answers"
    harness.mkdir()
    (harness / "AGENTS.md").write_text(HARNESS)
    published = run_reef(
        project, "release", "publish", "short-answers", "--kind", "harness", "--json", timeout=900
    )
    assert published.returncode == 0, published.stdout + published.stderr
    candidate = json.loads(published.stdout)
    evaluation = candidate["evaluation"]
    assert [result["task_id"] for result in evaluation["results"]] == [t.id for t in tasks]
    base_passed = sum(result["current_score"] == 1 for result in evaluation["results"])
    harness_passed = sum(result["candidate_score"] == 1 for result in evaluation["results"])
    assert evaluation["current_release_id"] == "base"
    assert base_passed < len(tasks), "the base model passes every task: nothing to improve"
    assert harness_passed > base_passed, evaluation["results"]
    assert candidate["state"] == "released" and candidate["release_id"] == "default@1"
