"""A search never runs on the suite that judges it (issue 76): `episodes` in a search recipe
names tasks of its own, and a task the gate's episodes judge on, wherever it lies (same
instruction, files and test), is refused by name. Before, the three searches searched on
`gate.episodes.tasks` by default: the gate then judged them on the tasks they were fitted to."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from reef.episodes.tasks import load_suite
from reef.sdk.prompt_search import NO_TASKS, EpisodeSearch, _refuse_the_gate_s_tasks
from reef.sdk.recipe import RecipeError

SUITE = Path(__file__).resolve().parents[2] / "evals" / "tasks"


def test_episodes_without_tasks_of_their_own_are_refused_at_load() -> None:
    with pytest.raises(ValidationError, match="a folder of Harbor tasks of its own"):
        EpisodeSearch.model_validate({})
    assert "gate.episodes.tasks" in NO_TASKS


def test_a_gate_task_in_the_search_suite_is_refused_by_name_wherever_it_lies(
    tmp_path: Path,
) -> None:
    search = tmp_path / "search"
    search.mkdir()
    shutil.copytree(SUITE / "write-word", search / "renamed-copy", symlinks=True)
    shutil.copytree(SUITE / "add-numbers", search / "add-numbers-edited", symlinks=True)
    instruction = search / "add-numbers-edited" / "instruction.md"
    instruction.write_text(instruction.read_text() + "\nShow your work.\n")
    with pytest.raises(RecipeError, match=r"\(renamed-copy\)"):
        _refuse_the_gate_s_tasks("gepa", load_suite(search), load_suite(SUITE))
    shutil.rmtree(search / "renamed-copy")
    _refuse_the_gate_s_tasks("gepa", load_suite(search), load_suite(SUITE))  # an edited one is new
