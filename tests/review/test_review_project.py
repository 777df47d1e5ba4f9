"""The project the review tests run on, built by real `reef release publish` processes, and the
reads (reef.review.queries) checked against it.

The engine is the loopback peer's `words` model, which echoes the prompt cut to `max_tokens`
words, so every score is known on any machine: the gate scores a one-word answer 1
(`^\\s*\\S+\\s*$`), the base answers "echo: Say hello." under the gate's 16 tokens, so the
harness capped at one token ("echo:") wins, the one that lets the model talk loses against it,
and the third, published under `gate: {policy: review}`, is held for a human.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from reef.config import load_config
from reef.learning.trackers import run_folder
from reef.releases.chain import ReleaseChain
from reef.releases.workflow import ReleaseWorkflow
from reef.review import queries
from reef.review.rows import CandidateDetail
from reef.store import ExperienceStore, Record, Report
from reef.testing.artifacts import harness
from reef.testing.processes import run_reef
from reef.tracing import TRACE_TAG
from reef.tui.screens.candidate_screen import heading
from reef.tui.screens.record_screen import conversation
from tests.conftest import peer_process


def engine(peer_url: str) -> str:
    return f"engine:\n  kind: upstream\n  upstream:\n    url: {peer_url}/v1\n    model: words\n"


TASK = {
    "id": "one-word",
    "messages": [{"role": "user", "content": "Say hello."}],
    "scorer": {"type": "regex", "pattern": r"^\s*\S+\s*$"},
}
_template: dict[str, Path] = {}


def build_template(folder: Path) -> Path:
    """Three real candidates (winner released as default@1, loser rejected, one held) and two
    records with feedback, gated on a peer started for the build (the project keeps its URL:
    the review tests read and decide, and nothing runs on the engine again)."""
    folder.mkdir(parents=True, exist_ok=True)
    with peer_process(folder).start() as peer:
        gated(folder, engine(peer.url))
    add_records(folder)
    return folder


def gated(folder: Path, engine: str) -> None:
    (folder / "reef.yaml").write_text(engine + "gate:\n  max_tokens: 16\n")
    (folder / "review.yaml").write_text(engine + "gate:\n  policy: review\n  max_tokens: 16\n")
    (folder / "evals").mkdir()
    (folder / "evals/default.jsonl").write_text(json.dumps(TASK) + "\n")
    publish(folder, harness(folder / "art/winner", "You are terse.", {"max_tokens": 1}), 0)
    publish(folder, harness(folder / "art/loser", "You are chatty.", {"max_tokens": 16}), 1)
    held = harness(folder / "art/held", "You are held for review.", {"max_tokens": 2})
    publish(folder, held, 0, "-c", "review.yaml")


def publish(folder: Path, artifact: Path, exit_code: int, *extra: str) -> None:
    reason = f"--reason={artifact.name} harness"
    result = run_reef(
        folder, "release", "publish", str(artifact), "--kind", "harness", reason, *extra
    )
    assert result.returncode == exit_code, result.stdout + result.stderr


def add_records(folder: Path) -> None:
    with ExperienceStore(folder / ".reef/experience.db") as store:
        for prompt, answer, score in (
            ("Name three colours.", "Red, green, blue.", 1.0),
            ("Capital of France?", "Lyon.", 0.0),
        ):
            record = Record(
                scenario="default",
                request={"messages": [{"role": "user", "content": prompt}]},
                response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
                engine="llamacpp",
                release_id="default@1",
            )
            store.add_record(record).result()
            store.add_report(Report("default", [record.id], score, f"scored {score:g}")).result()


@pytest.fixture
def project(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """A fresh copy of the template for each test (built once per session)."""
    if "path" not in _template:
        _template["path"] = build_template(tmp_path_factory.mktemp("review-template") / "p")
    copy = tmp_path / "project"
    shutil.copytree(_template["path"], copy)
    return copy


def candidates_by_reason(project: Path) -> dict[str, dict]:
    with ExperienceStore(project / ".reef/experience.db") as store:
        rows = store.query("SELECT id, state, decision, reason FROM candidates")
    return {row["reason"]: row for row in rows}


def head(project: Path, scenario: str = "default") -> str | None:
    found = ReleaseChain(project / ".reef/releases.git").head(scenario)
    return found.release_id if found else None


@pytest.fixture
def workflow(project: Path, monkeypatch: pytest.MonkeyPatch) -> ReleaseWorkflow:
    monkeypatch.chdir(project)
    store = ExperienceStore(project / ".reef/experience.db")
    yield ReleaseWorkflow(load_config(None), store)
    store.close()


def test_candidates_held_first_then_newest_with_means(
    workflow: ReleaseWorkflow, project: Path
) -> None:
    rows = queries.candidate_rows(workflow)
    assert [row.state for row in rows] == ["held", "rejected", "released"]
    assert [row.reason for row in rows] == ["held harness", "loser harness", "winner harness"]
    winner = rows[2]
    assert (winner.current_mean, winner.candidate_mean, winner.delta) == (0.0, 1.0, 1.0)
    assert rows[1].delta == -1.0
    assert [row.id for row in queries.candidate_rows(workflow, state="held")] == [rows[0].id]


def test_candidate_detail_pairs_answers_with_the_prompt_and_diffs_the_parent(
    workflow: ReleaseWorkflow,
) -> None:
    held = queries.candidate_rows(workflow, state="held")[0]
    detail = queries.candidate_detail(workflow, held.id)
    (task,) = detail.tasks
    assert task.task_id == "one-word" and task.prompt == "Say hello."
    assert task.current_score == 1.0 and task.current_answer.strip()
    assert "-You are terse." in detail.diff and "+You are held for review." in detail.diff
    assert detail.row.base_release_id == "default@1" and detail.weights == []
    assert detail.run_folder is None  # no learning step wrote curves for it


def test_a_candidate_s_training_run_is_linked_and_a_record_s_trace_shown(
    workflow: ReleaseWorkflow,
) -> None:
    held = queries.candidate_rows(workflow, state="held")[0]
    folder = run_folder(workflow.config.state_dir, "default", held.id)
    folder.mkdir(parents=True)
    detail = queries.candidate_detail(workflow, held.id)
    assert detail.run_folder == str(folder)
    assert f"tensorboard --logdir {folder}" in str(heading(detail))
    assert CandidateDetail.from_json(asdict(detail)).run_folder == str(folder)  # over HTTP
    store = workflow.candidates.store
    record = store.get_record(queries.record_rows(store)[0].id)
    assert record is not None and "trace" not in str(conversation(record)).split("\n")[1]
    record["metadata"] = {"tags": {TRACE_TAG: "4bf92f3577b34da6a3ce929d0e0e4736"}}
    assert "trace 4bf92f3577b34da6a3ce929d0e0e4736" in str(conversation(record))


def test_records_newest_first_with_feedback_and_search(workflow: ReleaseWorkflow) -> None:
    store = workflow.candidates.store
    rows = queries.record_rows(store)
    assert [row.prompt for row in rows] == ["Capital of France?", "Name three colours."]
    assert rows[0].feedback == "0 scored 0"
    (found,) = queries.record_rows(store, search="colours")
    assert found.answer == "Red, green, blue."
    assert queries.record_rows(store, search="100%_") == []


def test_scenarios_and_releases(workflow: ReleaseWorkflow) -> None:
    (summary,) = queries.scenario_summaries(workflow)
    assert (summary.scenario, summary.head, summary.serving) == (
        "default",
        "default@1",
        "default@1",
    )
    assert (summary.records, summary.reports, summary.waiting) == (2, 2, 1)
    assert summary.recent_mean == 0.5 and [p.score for p in summary.scores] == [1.0, 0.0]
    (served,) = summary.releases  # the two calls default@1 answered, one passed
    assert served["release_id"] == "default@1" and served["served"] == 2
    assert (served["reports"]["passed"], served["reports"]["count"]) == (1, 2)
    (release,) = queries.release_rows(workflow)
    assert release.release_id == "default@1" and release.serving and release.candidate_mean == 1.0
    assert "+You are terse." in queries.release_diff(workflow, "default@1")
