"""Scenarios created over HTTP and the training modes selected for them live in the store, on
both databases: another process (a replica, the learning worker) sees them, a restart keeps
them, and creating one twice (two replicas racing) keeps the first."""

from __future__ import annotations

from reef.scenario import RuntimeScenarios
from reef.store import ExperienceStore
from reef.store.scenarios import create_scenario, selected_training_mode


def test_what_one_replica_records_another_reads(store: ExperienceStore) -> None:
    mine, theirs = RuntimeScenarios(store), RuntimeScenarios(store)
    theirs.CACHE_S = 0.0  # read the store on every question
    mine.create("coding", "default@2")
    mine.select_mode("coding", "hybrid")
    assert "coding" in theirs.created and theirs.start_release("coding") == "default@2"
    assert theirs.training_mode("coding", "auto") == "hybrid"
    assert theirs.training_mode("support", "manual") == "manual"  # none selected: configured
    assert selected_training_mode(store, "coding") == "hybrid"  # what the learning worker reads


def test_a_scenario_created_twice_keeps_its_first_release(store: ExperienceStore) -> None:
    assert create_scenario(store, "race", "default@1")
    assert not create_scenario(store, "race", "default@3")
    assert RuntimeScenarios(store).start_release("race") == "default@1"


def test_a_mode_selected_before_the_scenario_was_created_creates_it(store: ExperienceStore) -> None:
    scenarios = RuntimeScenarios(store)
    scenarios.select_mode("fresh", "manual")
    scenarios.create("fresh")  # already there: its mode stays
    assert RuntimeScenarios(store).training_mode("fresh", "auto") == "manual"
