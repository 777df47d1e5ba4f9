"""Task folders in Harbor's format: the shipped suite loads, bad folders are refused with the
path and what is missing, and a Dockerfile that installs packages is reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reef.episodes.tasks import BadTask, load_suite, load_task

SUITE = Path(__file__).resolve().parents[2] / "evals" / "tasks"


def copy_of_task(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SUITE / "write-word", tmp_path / "write-word"))


def test_the_shipped_suite_loads_with_its_timeouts_and_oracles() -> None:
    tasks = load_suite(SUITE)
    assert [task.name for task in tasks] == ["add-numbers", "count-lines", "fix-typo", "write-word"]
    assert all(task.solution is not None and not task.needs_image for task in tasks)
    assert tasks[0].agent_timeout_s == 300 and tasks[0].memory_mb == 1024


def test_a_folder_without_task_toml_is_refused_naming_it(tmp_path: Path) -> None:
    task = copy_of_task(tmp_path)
    (task / "task.toml").unlink()
    with pytest.raises(BadTask, match=rf"{task}/task.toml: missing"):
        load_task(task)


def test_a_test_that_is_missing_or_not_executable_is_refused(tmp_path: Path) -> None:
    task = copy_of_task(tmp_path)
    test = task / "tests" / "test.sh"
    test.chmod(0o644)
    with pytest.raises(BadTask, match=rf"{test}: not executable"):
        load_task(task)
    test.unlink()
    with pytest.raises(BadTask, match=rf"{test}: missing"):
        load_task(task)


def test_bad_values_and_empty_suites_are_refused(tmp_path: Path) -> None:
    task = copy_of_task(tmp_path)
    (task / "task.toml").write_text("[agent]\ntimeout_sec = -1\n")
    with pytest.raises(BadTask, match=r"agent\.timeout_sec must be a positive, finite number"):
        load_task(task)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadTask, match="no task here"):
        load_suite(tmp_path / "empty")


def test_a_dockerfile_that_installs_packages_needs_its_image(tmp_path: Path) -> None:
    task = copy_of_task(tmp_path)
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.12\nRUN apt-get update && \\\n    apt-get install -y jq\n"
        "RUN pip install --no-cache-dir numpy\nRUN mkdir /data\n"
    )
    loaded = load_task(task)
    assert loaded.needs_image
    assert loaded.image_installs == (
        "RUN apt-get update && apt-get install -y jq",
        "RUN pip install --no-cache-dir numpy",
    )
