"""A hostile task.toml (issue 74): every number is finite and bounded, refused with what is
allowed before any cgroup is made, never dropped silently. `cpus = 1e9` made the cgroup write
fail and the runner run without the memory limit; `nan` killed `reef tasks run` with a
traceback and left cgroup folders behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.episodes.tasks import BadTask, load_task


def task(folder: Path, toml: str) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "environment").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "tests" / "test.sh").chmod(0o755)
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(toml)
    return folder


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[environment]\ncpus = 1e9\n", "environment.cpus is 1000000000.0; at most"),
        ("[environment]\ncpus = nan\n", "environment.cpus must be a positive, finite number"),
        ("[environment]\ncpus = inf\n", "positive, finite"),
        ("[environment]\nmemory_mb = nan\n", "environment.memory_mb must be a positive, finite"),
        ('[environment]\nmemory = "99999999G"\n', "environment.memory is"),
        ("[agent]\ntimeout_sec = inf\n", "agent.timeout_sec must be a positive, finite"),
        ("[verifier]\ntimeout_sec = 1e12\n", "verifier.timeout_sec is"),
        ("[verifier]\ntimeout_sec = -1\n", "positive"),
    ],
)
def test_a_number_out_of_bounds_is_refused_saying_what_is_allowed(
    tmp_path: Path, toml: str, says: str
) -> None:
    with pytest.raises(BadTask, match=r"task\.toml") as refused:
        load_task(task(tmp_path / "t", toml))
    assert says in str(refused.value)


def test_numbers_within_bounds_load(tmp_path: Path) -> None:
    loaded = load_task(task(tmp_path / "t", '[environment]\ncpus = 1\nmemory = "512M"\n'))
    assert loaded.cpus == 1.0 and loaded.memory_mb == 512


def test_a_task_s_strings_are_printed_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A category with ESC sequences cleared the screen and set the window title in `reef
    tasks list`; `[/red]` gave a MarkupError traceback. Both print as text now."""
    from typer.testing import CliRunner

    from reef.cli import app, output

    # A table as wide as its cells whatever the terminal (Rich keeps its width in `_width`).
    monkeypatch.setattr(output.console, "_width", 200)
    hostile = "\\u001b]0;x\\u0007[/red]"  # a window title, then markup that closes nothing
    folder = task(tmp_path / "tâche-任务", f'[metadata]\ncategory = "{hostile}"\n')
    result = CliRunner().invoke(app, ["tasks", "list", str(folder)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "[/red]" in result.output  # the markup as written, not applied
    assert "tâche-任务" in result.output
