"""`reef release …` on the stores directly, with no server running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli import app
from reef.config import load_config
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.artifacts import harness
from reef.testing.processes import run_reef
from tests.conftest import needs_git_lfs

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reef.yaml").write_text(
        "engine:\n  llamacpp:\n    n_ctx: 1024\n    n_threads: 2\ngate:\n  policy: review\n"
    )
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "scorer": {"type": "regex", "pattern": "."},
            }
        )
        + "\n"
    )
    return tmp_path


def reef(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def publish(folder: Path, *extra: str) -> dict:
    code, output = reef("release", "publish", str(folder), "--kind", "harness", "--json", *extra)
    assert code == 0, output
    return json.loads(output)


def test_publish_list_show_diff_rollback_promote(project: Path) -> None:
    first = publish(harness(project / "a", "You are A.", rules={"tone": "Be calm.\n"}), "--approve")
    assert first["state"] == "released" and first["release_id"] == "default@1"
    publish(harness(project / "b", "You are B.", rules={"tone": "Be calm.\n"}), "--approve")

    code, output = reef("release", "list", "--json")
    releases = json.loads(output)
    assert [r["release_id"] for r in releases] == ["default@2", "default@1"]
    assert {"release_id", "parent_release_id", "scenario", "kind", "created_at"} <= set(releases[0])
    assert releases[0]["parent_release_id"] == "default@1"

    code, output = reef("release", "show", "default@2", "--json")
    assert code == 0 and json.loads(output)["files"] == {"AGENTS.md": 11, "rules/tone.md": 9}

    code, output = reef("release", "diff", "default@1", "default@2", "--json")
    diffs = json.loads(output)["files"]
    assert list(diffs) == ["AGENTS.md"]
    assert "-You are A." in diffs["AGENTS.md"] and "+You are B." in diffs["AGENTS.md"]
    code, output = reef("release", "diff", "default@1", "default@2")
    assert code == 0 and "You are B." in output

    code, output = reef("release", "rollback", "--json")
    assert code == 0 and json.loads(output)["release_id"] == "default@3"
    code, output = reef(
        "release", "promote", "default@2", "--scenario", "staging", "--reason", "B for QA", "--json"
    )
    assert code == 0 and json.loads(output)["release_id"] == "staging@1"
    assert "B for QA" in json.loads(output)["reason"]  # every decision says why
    code, output = reef("release", "list")
    assert code == 0 and "staging@1" in output and "default@3" in output


def test_held_candidates_then_approve_conflict_exits_3(project: Path) -> None:
    one = publish(harness(project / "a", "A.", {"max_tokens": 2}))
    two = publish(harness(project / "b", "B.", {"max_tokens": 2}))
    assert one["state"] == two["state"] == "held"
    code, output = reef("release", "candidates", "--state", "held", "--json")
    assert {c["id"] for c in json.loads(output)} == {one["id"], two["id"]}
    code, output = reef("release", "approve", one["id"])
    assert code == 0 and "default@1" in output
    code, output = reef("release", "approve", two["id"])
    assert code == 3 and "default@1" in output and f"reef release regate {two['id']}" in output
    code, output = reef("release", "reject", two["id"], "--reason", "superseded")
    assert code == 0 and "rejected" in output


def test_a_stale_held_candidate_is_regated_against_the_new_head(project: Path) -> None:
    one = publish(harness(project / "a", "A.", {"max_tokens": 2}))
    two = publish(harness(project / "b", "B.", {"max_tokens": 2}))
    assert reef("release", "approve", one["id"])[0] == 0
    code, output = reef("release", "regate", two["id"], "--json")
    assert code == 0, output
    regated = json.loads(output)
    assert regated["state"] == "held" and regated["base_release_id"] == "default@1"
    code, output = reef("release", "show", two["id"], "--json")
    assert json.loads(output)["decision"].startswith("superseded: re-gated against default@1")
    code, output = reef("release", "approve", regated["id"])
    assert code == 0 and "default@2" in output


def test_unknown_ids_and_bad_kinds_are_clear(project: Path) -> None:
    code, output = reef("release", "show", "default@7")
    assert code == 1 and "no release 'default@7'" in output
    code, output = reef("release", "approve", "cand_nope")
    assert code == 1 and "no candidate" in output
    code, output = reef("release", "publish", str(project), "--kind", "prompt")
    assert code == 2 and "--kind" in output


def test_diff_of_weight_releases_gives_sizes_without_reading_the_weights(project: Path) -> None:
    needs_git_lfs()
    for name, size in (("a", 1000), ("b", 2000)):
        folder = project / name
        folder.mkdir()
        (folder / "adapter.gguf").write_bytes(b"w" * size)
        (folder / "adapter.json").write_text(f'{{"size": {size}}}\n')
        code, output = reef("release", "publish", str(folder), "--kind", "lora", "--approve")
        assert code == 0, output
    code, output = reef("release", "diff", "default@1", "default@2", "--json")
    assert code == 0, output
    diff = json.loads(output)
    assert diff["weights"] == {"adapter.gguf": {"bytes": [1000, 2000]}}
    assert '-{"size": 1000}' in diff["files"]["adapter.json"]
    assert diff["parts"] == [["adapter"], ["adapter"]]
    (project / "b" / "AGENTS.md").write_text("Be brief.\n")  # the adapter and a harness: agent
    code, output = reef("release", "publish", str(project / "b"), "--kind", "agent", "--approve")
    assert code == 0, output
    code, output = reef("release", "diff", "default@2", "default@3", "--json")
    assert json.loads(output)["parts"] == [["adapter"], ["harness", "adapter"]]


def test_a_config_in_another_folder_finds_its_own_state(tmp_path: Path) -> None:
    """`-c other/reef.yaml` from elsewhere reads that project's releases and creates nothing
    where it runs."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "reef.yaml").write_text("state_dir: .reef\ngate:\n  policy: always\n")
    harness(project / "h", "You are A.")
    published = run_reef(project, "release", "publish", "h", "--kind", "harness", "--approve")
    assert published.returncode == 0, published.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = run_reef(elsewhere, "release", "list", "-c", "../project/reef.yaml", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["release_id"] for r in json.loads(listed.stdout)] == ["default@1"]
    assert list(elsewhere.iterdir()) == []


def test_show_a_candidate_its_state_evaluation_and_diff_against_its_base(project: Path) -> None:
    publish(harness(project / "a", "You are A."), "--approve")
    config = load_config(project / "reef.yaml", env={})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        proposed = workflow.propose("default", "harness", {"AGENTS.md": b"You are B.\n"})
        workflow.reject(proposed.id, "B is not what we want")

    code, output = reef("release", "show", proposed.id, "--json")
    assert code == 0, output
    shown = json.loads(output)
    assert shown["id"] == proposed.id and shown["state"] == "rejected"
    assert shown["base_release_id"] == "default@1"
    assert "-You are A." in shown["diff"] and "+You are B." in shown["diff"]
    code, output = reef("release", "show", proposed.id)
    assert code == 0 and "rejected" in output and "B is not what we want" in output
    code, output = reef("release", "show", "cand_nothing")
    assert code != 0 and "no candidate 'cand_nothing'" in output


def printed(project: Path, columns: int, *args: str) -> str:
    """The real CLI in its own process, in a terminal `columns` wide."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-m", "reef", *args], cwd=project, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_releases_and_candidates_read_whole_at_80_columns(project: Path) -> None:
    """Issue 75: at 80 columns the tables wrapped each reason one word a line, about 45 lines a
    release. Narrower than 120 columns, each is a block: its reason and decision wrapped whole."""
    reason = "because the users asked for shorter answers in plain words and this keeps the rest"
    publish(harness(project / "a", "You are A."), "--approve", "--reason", reason)
    publish(harness(project / "b", "You are B."))  # held: policy review
    for args, said in (
        (("release", "list"), reason),
        (("release", "candidates"), "gate policy is review: waiting for a human"),
    ):
        narrow = printed(project, 80, *args)
        assert all(len(line) <= 80 for line in narrow.splitlines()), narrow
        flowing = " ".join(narrow.split())
        assert said in flowing, narrow
        assert len(narrow.splitlines()) <= 12, narrow  # a few lines each, not a word a line
        wide = printed(project, 200, *args)
        assert "┃" in wide or "│" in wide  # a table where there is room for one
