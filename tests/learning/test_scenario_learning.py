"""A learning strategy per scenario: each scenario's own recipes and mode, several recipes on one
scenario in turn, lanes that run side by side so a slow step never starves another scenario, and
bad learning config refused at start with the scenario and key named."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from reef.config import ReefConfig, load_config
from reef.engines.base import Engine
from reef.inference.model import LocalModel
from reef.learning.plans import load_plans
from reef.learning.worker import LearningWorker
from reef.sdk.recipe import RecipeError
from reef.store import ExperienceStore, Record, Report
from reef.store.learning import learning_status
from reef.testing.processes import run_reef
from reef.testing.scripted_engine import ScriptedEngine


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The served model, scripted: these tests are about the worker, not what a model says."""
    return ScriptedEngine("A scripted answer.")


# Project recipes: `Slow` blocks in propose until the test creates its file; the others propose
# a harness at once (the gate's `always` policy releases it without evaluating).
RECIPES = """
import time
from pathlib import Path

from reef.sdk import Proposal, Recipe


class Fast(Recipe):
    name = "fast"

    def ready(self, view):
        return True

    def propose(self, batch, context):
        text = f"After {context.release_id}.\\n".encode()
        consumed = [r for t in batch for r in t.record_ids]
        return Proposal("harness", {"AGENTS.md": text}, self.name, consumed)


class AlsoFast(Fast):
    name = "also_fast"


class Slow(Fast):
    name = "slow"

    def propose(self, batch, context):
        gate = Path(__file__).parent / "let-slow-go"
        deadline = time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().propose(batch, context)
"""


def project(folder: Path, scenarios: str, learning: str = "") -> ReefConfig:
    (folder / "recipes.py").write_text(RECIPES)
    text = (
        f"state_dir: {folder}/.reef\ngate:\n  policy: always\n"
        f"learning:\n  interval_s: 0.05\n  scenarios: []\n{learning}scenarios:\n{scenarios}"
    )
    (folder / "reef.yaml").write_text(text)
    return load_config(folder / "reef.yaml", env={})


def test_plans_resolve_each_scenarios_recipes_and_mode() -> None:
    config = ReefConfig.model_validate(
        {
            "learning": {"recipe": "sft", "steps": 3, "mode": "auto"},
            "scenarios": {
                "support": {
                    "learning": {
                        "mode": "hybrid",
                        "recipes": [{"recipe": "harness_evolve"}, {"recipe": "sft", "steps": 9}],
                    }
                },
                "coding": {"learning": {"mode": "manual"}},  # the default recipe, its own mode
                "quiet": {"gate": {"policy": "always"}},  # learns only if listed in learning
            },
        }
    )
    plans = {plan.scenario: plan for plan in config.learning_plans()}
    assert list(plans) == ["default", "support", "coding"]
    assert [(c.recipe, c.settings()) for c in plans["default"].recipes] == [("sft", {"steps": 3})]
    support = plans["support"]
    assert support.mode == "hybrid" and support.key == "scenarios.support.learning"
    assert [(c.recipe, c.settings()) for c in support.recipes] == [
        ("harness_evolve", {}),
        ("sft", {"steps": 9}),
    ]
    assert plans["coding"].mode == "manual" and plans["coding"].key == "learning"


def test_a_scenarios_settings_without_its_recipe_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_size: a recipe's settings need the recipe"):
        ReefConfig.model_validate(
            {"scenarios": {"support": {"learning": {"mode": "manual", "batch_size": 2}}}}
        )


@pytest.mark.parametrize(
    ("scenarios", "engine", "named"),
    [
        ("  support:\n    learning:\n      recipe: nope\n", "", "scenarios.support.learning"),
        (
            "  support:\n    learning:\n      recipe: harness_evolve\n      bogus: 1\n",
            "",
            "bogus",
        ),
        (
            "  support:\n    learning:\n      recipes:\n        - recipe: harness_evolve\n"
            "        - recipe: nope\n",
            "",
            "scenarios.support.learning.recipes[1]",
        ),
        (
            "  support:\n    learning:\n      recipe: sft\n",
            "engine:\n  kind: upstream\n  upstream:\n    url: http://127.0.0.1:9/v1\n",
            "the upstream engine's weights are remote",
        ),
    ],
)
def test_bad_learning_config_is_refused_at_start_naming_the_key(
    tmp_path: Path, scenarios: str, engine: str, named: str
) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\n{engine}scenarios:\n{scenarios}"
    )
    with pytest.raises(RecipeError, match="scenario support") as refused:
        load_plans(load_config(tmp_path / "reef.yaml", env={}))
    assert named in refused.value.message
    served = run_reef(tmp_path, "serve", "--port", "9")  # refused before anything is loaded
    assert served.returncode == 2 and named in " ".join(served.stderr.split())


def test_two_scenarios_learn_at_once_and_a_slow_step_starves_neither(
    tmp_path: Path, engine: Engine
) -> None:
    scenarios = (
        f"  slow:\n    learning:\n      recipe: {tmp_path}/recipes.py:Slow\n"
        f"  fast:\n    learning:\n      recipe: {tmp_path}/recipes.py:Fast\n"
    )
    config = project(tmp_path, scenarios)
    store = ExperienceStore(config.experience_db)
    worker = LearningWorker(config, store, LocalModel(engine))
    assert {s: [x.recipe.name for x in lane.learners] for s, lane in worker.lanes.items()} == {
        "slow": ["slow"],
        "fast": ["fast"],
    }
    chain = worker.workflow.chain

    async def learn() -> tuple[int, int]:
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + 60
        while (head := chain.head("fast")) is None or head.number < 3:
            assert time.monotonic() < deadline, "the fast scenario starved"
            await asyncio.sleep(0.05)
        slow_meanwhile = chain.head("slow")
        (tmp_path / "let-slow-go").touch()
        while chain.head("slow") is None:
            assert time.monotonic() < deadline, "the slow scenario never finished its step"
            await asyncio.sleep(0.05)
        stop.set()
        await running
        return head.number, 0 if slow_meanwhile is None else slow_meanwhile.number

    fast_releases, slow_releases_meanwhile = asyncio.run(learn())
    assert fast_releases >= 3 and slow_releases_meanwhile == 0
    status = learning_status(store)
    assert status["slow"]["recipes"]["slow"]["last_step"]["outcome"] == "released"
    assert status["fast"]["recipes"]["fast"]["steps"] >= 3
    store.close()


def test_recipes_of_one_scenario_step_in_turn_and_each_consumes_for_itself(
    tmp_path: Path, engine: Engine
) -> None:
    scenarios = (
        "  both:\n    learning:\n      recipes:\n"
        f"        - recipe: {tmp_path}/recipes.py:Fast\n"
        f"        - recipe: {tmp_path}/recipes.py:AlsoFast\n"
    )
    config = project(tmp_path, scenarios)
    store = ExperienceStore(config.experience_db)
    record = Record(
        scenario="both",
        request={"messages": [{"role": "user", "content": "Hi"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "Yo"}}]},
        engine="test",
        release_id="base",
    )
    record_id = store.add_record(record).result()
    store.add_report(Report("both", [record_id], score=0.0, feedback="say hello")).result()
    worker = LearningWorker(config, store, LocalModel(engine))
    first = asyncio.run(worker.step("both", force=True))
    fast, also_fast = (learner.recipe for learner in worker.lanes["both"].learners)
    # What one recipe learned from, the other still may.
    assert worker.view("both", fast).counts.waiting == 0
    assert worker.view("both", also_fast).counts.waiting == 1
    second = asyncio.run(worker.step("both", force=True))
    assert (first.recipe, second.recipe) == ("fast", "also_fast")
    assert (first.outcome, second.outcome) == ("released", "released")
    both = learning_status(store)["both"]["recipes"]
    assert both["fast"]["steps"] == both["also_fast"]["steps"] == 1
    assert worker.workflow.chain.head("both").number == 2
    store.close()


def test_status_names_each_scenarios_mode_and_recipes_and_reef_status_lists_them() -> None:
    from reef.cli.client_commands import _learning_table
    from reef.scenario import RuntimeScenarios
    from reef.server.reef_api.records import _with_plans

    config = ReefConfig.model_validate(
        {
            "learning": {"recipe": "sft"},
            "scenarios": {"support": {"learning": {"recipes": [{"recipe": "harness_evolve"}]}}},
        }
    )
    last = {"outcome": "error", "error": "RecipeError: no weights"}
    steps = {
        "default": {"recipes": {"sft": {"steps": 3, "last_step": last}}, "learner": "a:7:f00"},
        "old": {},
    }
    status = _with_plans(config, RuntimeScenarios(), steps)
    assert status["default"]["mode"] == "auto"
    assert status["default"]["plan"] == [{"recipe": "sft", "name": "sft"}]
    assert status["support"]["plan"] == [{"recipe": "harness_evolve", "name": "harness_evolve"}]
    table = _learning_table(status)
    rows = list(zip(*(column.cells for column in table.columns), strict=True))
    assert rows == [
        ("default", "auto", "a:7:f00", "sft", "3", "error: RecipeError: no weights"),
        ("support", "auto", "-", "harness_evolve", "0", "-"),
    ]  # "old" learned once and learns no more: not listed
    from reef.cli.client_commands import _remote_line

    gone = {
        "url": "https://***@git/r.git",
        "reachable": False,
        "error": "timeout",
        "diverged": ["a"],
    }
    assert "unreachable (timeout): serving what it has" in _remote_line(gone)
    assert "local chain not on the remote: a" in _remote_line(gone)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_one_worker_learns_on_a_scenario_and_another_takes_over_when_it_dies(
    tmp_path: Path, engine: Engine, database: str, request: pytest.FixtureRequest
) -> None:
    """Two workers share one store, as two replicas' would: only the lease's holder steps the
    scenario. The holder dies without a word (its lease is not given up, as after kill -9); the
    other takes the lease once it expires and learns on."""
    scenarios = f"  fast:\n    learning:\n      recipe: {tmp_path}/recipes.py:Fast\n"
    config = project(tmp_path, scenarios, learning="  lease_s: 1.0\n")
    location = (
        request.getfixturevalue("postgres_url")
        if database == "postgresql"
        else config.experience_db
    )
    stores = [ExperienceStore(location), ExperienceStore(location)]
    workers = [LearningWorker(config, store, LocalModel(engine)) for store in stores]
    chain = workers[0].workflow.chain

    async def learn() -> tuple[list[set[str]], float]:
        stops = [asyncio.Event(), asyncio.Event()]
        runs = [asyncio.create_task(w.run(stop)) for w, stop in zip(workers, stops, strict=True)]
        deadline = time.monotonic() + 60
        while (head := chain.head("fast")) is None or head.number < 2:
            assert time.monotonic() < deadline, "nobody learned"
            await asyncio.sleep(0.05)
        leading = [set(worker.leading) for worker in workers]
        leader = workers[0] if leading[0] else workers[1]
        leader.leases.give_up = lambda: None  # type: ignore[method-assign]  # as if killed
        runs[workers.index(leader)].cancel()
        died, released_then = time.monotonic(), head.number
        while (head := chain.head("fast")) is None or head.number <= released_then:
            assert time.monotonic() < deadline, "nobody took over"
            await asyncio.sleep(0.05)
        took_over_s = time.monotonic() - died
        for stop in stops:
            stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        return leading, took_over_s

    leading, took_over_s = asyncio.run(learn())
    assert sorted(map(sorted, leading)) == [[], ["fast"]]  # exactly one learned
    assert took_over_s < 10, f"the lease (1 s) was taken over only after {took_over_s:.1f} s"
    for store in stores:
        store.close()


def test_a_worker_whose_renewal_hangs_stops_learning_before_its_lease_runs_out(
    tmp_path: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that never returns (a connection the network dropped, a lock another process
    holds) must not leave the worker learning after the lease expired and another took it."""
    import reef.learning.leases as leases_module

    scenarios = f"  fast:\n    learning:\n      recipe: {tmp_path}/recipes.py:Fast\n"
    config = project(tmp_path, scenarios, learning="  lease_s: 0.5\n")
    with ExperienceStore(config.experience_db) as store:
        worker = LearningWorker(config, store, LocalModel(engine))

        async def hang_on_renewal() -> list[bool]:
            await worker.leases.hold("fast", 0.5)
            seen = [worker.leads("fast")]
            monkeypatch.setattr(leases_module, "take_lease", lambda *_: time.sleep(2) or True)
            renewing = asyncio.create_task(worker.leases.hold("fast", 0.5))
            await asyncio.sleep(0.5)
            seen.append(worker.leads("fast"))
            await renewing
            return seen

        assert asyncio.run(hang_on_renewal()) == [True, False]


def test_training_processes_reach_every_weight_recipe_unless_it_sets_its_own() -> None:
    config = ReefConfig.model_validate(
        {
            "training": {"processes": 2},
            "learning": {"recipes": [{"recipe": "sft"}, {"recipe": "harness_evolve"}]},
            "scenarios": {"solo": {"learning": {"recipe": "sft", "processes": 1}}},
        }
    )
    plans = {plan.scenario: plan for plan in load_plans(config)}
    sft, harness = plans["default"].recipes
    assert sft.settings.processes == 2  # type: ignore[attr-defined]
    assert not hasattr(harness.settings, "processes")  # a harness recipe trains nothing
    assert plans["solo"].recipes[0].settings.processes == 1  # type: ignore[attr-defined]
