"""What a publish refuses before anything is released: settings a request would refuse, unknown
settings, symbolic links out of the folder, artifact paths outside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reef.config import load_config
from reef.errors import ReefError
from reef.releases.chain import read_folder
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.artifacts import harness
from reef.testing.processes import run_reef


def project(folder: Path, policy: str = "always") -> Path:
    text = f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\ngate:\n  policy: {policy}\n"
    (folder / "reef.yaml").write_text(text)
    return folder / "reef.yaml"


def test_publish_refuses_settings_that_could_not_serve(tmp_path: Path) -> None:
    project(tmp_path)
    harness(tmp_path / "hot", "Hi.", settings={"temperature": "hot"})
    result = run_reef(tmp_path, "release", "publish", "hot", "--kind", "harness", "--approve")
    assert result.returncode != 0
    assert "temperature" in result.stderr and "Traceback" not in result.stderr

    harness(tmp_path / "odd", "Hi.", settings={"temperature": 0.2, "colour": "blue"})
    result = run_reef(tmp_path, "release", "publish", "odd", "--kind", "harness", "--approve")
    assert result.returncode != 0
    assert "colour" in result.stderr and "Traceback" not in result.stderr

    listed = run_reef(tmp_path, "release", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    candidates = run_reef(tmp_path, "release", "candidates", "--json")
    decisions = [c["decision"] for c in json.loads(candidates.stdout)]
    assert [c["state"] for c in json.loads(candidates.stdout)] == ["rejected", "rejected"]
    assert "colour" in decisions[0] and "temperature" in decisions[1]


def test_publish_refuses_symlinks_out_of_the_folder(tmp_path: Path) -> None:
    project(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not publish me")
    folder = harness(tmp_path / "h", "Hi.")
    (folder / "rules").mkdir()
    (folder / "rules/leak.md").symlink_to(secret)
    result = run_reef(tmp_path, "release", "publish", "h", "--kind", "harness", "--approve")
    assert result.returncode != 0
    assert "rules/leak.md" in result.stderr and "symbolic link" in result.stderr
    with pytest.raises(ReefError, match="symbolic link"):
        read_folder(folder)
    listed = run_reef(tmp_path, "release", "list", "--json")
    assert json.loads(listed.stdout) == []


def test_a_symlinked_folder_inside_an_artifact_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.md").write_text("x")
    folder = harness(tmp_path / "h", "Hi.")
    (folder / "skills").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ReefError, match=r"skills.*symbolic link"):
        read_folder(folder)


@pytest.mark.parametrize("bad", ["../escape.md", "ABSOLUTE", "reef-release.json", "a/../../b"])
def test_propose_checks_every_path_before_writing_anything(tmp_path: Path, bad: str) -> None:
    config = load_config(project(tmp_path), env={})
    bad = str(tmp_path / "abs.md") if bad == "ABSOLUTE" else bad
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        with pytest.raises(ReefError, match="not allowed"):
            workflow.propose("default", "harness", {"AGENTS.md": b"Hi.\n", bad: b"x"})
        assert workflow.candidates.list() == []
    assert not (config.state_dir / "candidates").exists()
    assert not (tmp_path / "abs.md").exists()


def test_read_folder_skips_git_and_reads_a_symlinked_top_folder(tmp_path: Path) -> None:
    folder = harness(tmp_path / "real", "Hi.")
    (folder / ".git").mkdir()
    (folder / ".git/config").write_text("x")
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    assert os.path.islink(tmp_path / "link")
    assert read_folder(tmp_path / "link") == {"AGENTS.md": b"Hi.\n"}
