"""Proactive acquisition: a recipe asks for episodes on tasks it chooses (`StepContext.
run_episodes`), and they run in the sandbox against the running `reef serve` (a scripted model
whose answers are known), each episode's calls stored as records with its test's report."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.config import load_config
from reef.engines import build_engine
from reef.inference.model import LocalModel
from reef.learning.plans import LoadedPlan
from reef.learning.worker import LearningWorker
from reef.sdk.recipe import Recipe, RecipeError, load_recipe
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream
from tests.conftest import TOKEN
from tests.e2e.episodes.test_episodes import SUITE, scripted


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ServerProcess]]:
    project = tmp_path_factory.mktemp("project")
    with chat_upstream(scripted, "scripted") as upstream:
        (project / "reef.yaml").write_text(
            f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
            "learning:\n  recipe: harness_evolve\n  proposer: rule\n"
            "episodes:\n  wall_time_s: 60\n  max_steps: 4\n"
        )
        with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
            yield project, server


def learner_of(project: Path, recipe_name: str = "harness_evolve") -> LearningWorker:
    """A learning worker on the project's config, its one recipe `recipe_name`."""
    config = load_config(project / "reef.yaml", env={"REEF_TOKEN": TOKEN})
    recipe = load_recipe(recipe_name, config.learning.recipe_settings())
    store = ExperienceStore(config.experience_db)
    engine = build_engine(config.engine)
    return LearningWorker(
        config, store, LocalModel(engine), plans=[LoadedPlan("default", "auto", [recipe])]
    )


def context_recipe(learner: LearningWorker) -> Recipe:
    return learner.lanes["default"].learners[0].recipe


def test_a_recipe_s_episodes_run_against_the_server_and_become_experience(
    served: tuple[Path, ServerProcess],
) -> None:
    project, _ = served
    learner = learner_of(project)
    context = learner._context("default", context_recipe(learner), None)
    assert context.run_episodes is not None
    (episode,) = context.run_episodes(SUITE / "write-word")
    assert episode["passed"] and episode["task"] == "write-word" and episode["report_id"]
    stored = learner.store.get_record(episode["calls"][0])
    assert stored is not None and stored["metadata"]["tags"]["episode"] == episode["id"]
    assert [report["score"] for report in stored["reports"]] == [1.0]
    view = asyncio.run(asyncio.to_thread(learner.view, "default", context_recipe(learner)))
    assert any(episode["calls"][0] in t.record_ids for t in view.trajectories)
    learner.store.close()


def test_without_a_running_server_a_recipe_is_told_to_start_one(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\nengine:\n  kind: upstream\n  upstream:\n"
        "    url: http://127.0.0.1:9/v1\nlearning:\n  recipe: harness_evolve\n"
    )
    learner = learner_of(tmp_path)
    context = learner._context("default", context_recipe(learner), None)
    assert context.run_episodes is not None
    with pytest.raises(RecipeError, match="start `reef serve`"):
        context.run_episodes(SUITE / "write-word")
    learner.store.close()
