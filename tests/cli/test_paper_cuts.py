"""A newcomer's paper cuts (issue 75), each through the real CLI: the version, an install hint
printed as written, and the first release rolled back to the model alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef import __version__
from reef.cli import app
from reef.cli.output import fail
from reef.testing.artifacts import harness

runner = CliRunner()


def test_reef_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"reef {__version__}"


def test_an_error_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    with pytest.raises(typer.Exit):
        fail("reef learning curve draws with matplotlib: pip install 'reef[plot]'")
    assert "pip install 'reef[plot]'" in capsys.readouterr().err


def test_the_first_release_rolls_back_to_the_model_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reef.yaml").write_text("gate:\n  policy: always\n")
    folder = harness(tmp_path / "h", "Be brief.")
    published = runner.invoke(
        app, ["release", "publish", str(folder), "--kind", "harness", "--approve"]
    )
    assert published.exit_code == 0, published.output
    rolled = runner.invoke(app, ["release", "rollback", "--reason", "not yet", "--json"])
    assert rolled.exit_code == 0, rolled.output
    release = json.loads(rolled.output)
    assert release["release_id"] == "default@2" and release["reason"] == "not yet"
    shown = json.loads(runner.invoke(app, ["release", "show", "default@2", "--json"]).output)
    assert shown["files"] == {} and shown["parts"] == []  # nothing but the model serves
    assert shown["origin"] == {"action": "rollback", "release_id": "base"}
    again = runner.invoke(app, ["release", "rollback", "--to", "base", "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["release_id"] == "default@3"


def test_init_writes_a_learning_block_that_works_when_uncommented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reef.config import load_config

    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["init", "demo"]).exit_code == 0
    written = (tmp_path / "demo" / "reef.yaml").read_text()
    assert load_config(tmp_path / "demo" / "reef.yaml", env={}).learning.recipe is None
    block = written[written.index("# learning:") :]
    uncommented = "\n".join(
        line[2:] if line.startswith(("# learning:", "#   ")) else line
        for line in block.splitlines()
    )
    (tmp_path / "demo" / "reef.yaml").write_text(written.replace(block, uncommented))
    config = load_config(tmp_path / "demo" / "reef.yaml", env={})
    assert config.learning.recipe == "harness_evolve"
    assert config.learning.recipe_settings()["scorer"] == {
        "type": "regex",
        "pattern": "Cheers\\W*$",
    }
