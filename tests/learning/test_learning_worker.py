"""The learning worker's steps on real stores, with a real proposer model over HTTP."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from reef.config import GateConfig, load_config
from reef.engines.base import Engine
from reef.evaluation.held_out import held_out as held_out_for_the_gate
from reef.evaluation.replay import held_back
from reef.inference.model import LocalModel
from reef.learning.plans import LoadedPlan
from reef.learning.worker import LearningWorker, not_ready
from reef.sdk.recipe import Proposal, Recipe, StepContext, load_recipe
from reef.sdk.view import ExperienceView, Trajectory
from reef.store import ExperienceStore, Record, Report
from reef.store.experience import new_id
from reef.store.learning import learning_status, queue_instruction
from reef.store.scenarios import select_training_mode
from reef.testing.processes import ServerProcess
from reef.testing.scripted_engine import ScriptedEngine
from reef.testing.scripted_user import eval_tasks


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The served model, scripted: these tests are about the worker, not what a model says."""
    return ScriptedEngine("A scripted answer.")


def worker(
    tmp_path: Path,
    engine: Engine,
    reply: str,
    peer: ServerProcess,
    mode: str = "auto",
    batch_size: int = 1,
    replay: int = 8,
    held_out: float = 0.25,
) -> LearningWorker:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\nlearning:\n  recipe: harness_evolve\n  mode: {mode}\n"
        f"  proposer: llm\n  batch_size: {batch_size}\n  proposer_url: {peer.url}/v1\n"
        f"  proposer_model: 'reply:{reply}'\ngate:\n  replay: {replay}\n  held_out: {held_out}\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    recipe = load_recipe("harness_evolve", config.learning.recipe_settings())
    plan = LoadedPlan("default", config.learning.mode, [recipe])
    return LearningWorker(config, store, LocalModel(engine), plans=[plan])


def scored_call(
    store: ExperienceStore, asked: str, answer: str, score: float, feedback: str | None = None
) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": asked}]},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="test",
        release_id="base",
    )
    record_id = store.add_record(record).result()
    store.add_report(Report("default", [record_id], score=score, feedback=feedback)).result()
    return record_id


def failing_call(store: ExperienceStore) -> str:
    return scored_call(store, "Hi", "Yo", 0.0, "greet me formally")


def test_records_that_do_not_yet_make_a_batch_say_so(
    tmp_path: Path, engine: Engine, peer: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # Without the gate's replay: a good answer could be held back for it (one in four, by its
    # id), and the count of waiting records would depend on the id drawn.
    learner = worker(tmp_path, engine, "I would rather not.", peer, batch_size=2, replay=0)
    failing_call(learner.store)
    with caplog.at_level(logging.INFO, logger="reef.learning"):
        filling = asyncio.run(learner.step("default"))
        assert caplog.records == []  # a batch filling up is not worth a log line
        scored_call(learner.store, "Hello", "Good day to you.", 1.0)  # nothing to learn from
        stuck = asyncio.run(learner.step("default"))
        again = asyncio.run(learner.step("default"))
    said = (
        "record(s) waiting, not yet a batch harness_evolve can learn from: 1 of the 2 failing "
        "turns a batch needs (scored below 0.5, or feedback without a score)"
    )
    assert (filling.outcome, filling.detail) == ("waiting", f"1 {said}")
    assert (stuck.outcome, stuck.detail) == ("waiting", f"2 {said}")
    assert again.detail == "no new experience"
    assert [r.getMessage() for r in caplog.records] == [f"default: 2 {said}"]  # said once
    learner.store.close()


def test_waiting_says_what_was_held_out_for_the_gate(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    # Nearly every failing prompt held out: a newcomer's first reports can all be the gate's.
    learner = worker(tmp_path, engine, "I would rather not.", peer, batch_size=2, held_out=0.99)
    failing_call(learner.store)
    assert held_out_for_the_gate("Hi", 0.99)
    waiting = asyncio.run(learner.step("default"))
    assert waiting.outcome == "waiting"
    assert waiting.detail.startswith("0 record(s) waiting, not yet a batch harness_evolve")
    assert waiting.detail.endswith("; 1 held out for the gate")
    learner.store.close()


def test_a_garbage_proposal_makes_no_candidate_and_says_why(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    learner = worker(tmp_path, engine, "I would rather not.", peer)
    assert asyncio.run(learner.step("default")).outcome == "waiting"
    failing_call(learner.store)
    result = asyncio.run(learner.step("default"))
    assert result.outcome == "no proposal" and "no JSON object" in result.detail
    assert learner.workflow.candidates.list("default") == []
    # Asked again with nothing new, the proposer is not bothered a second time.
    again = asyncio.run(learner.step("default"))
    assert (again.outcome, again.detail) == ("waiting", "no new experience")
    failing_call(learner.store)  # a retry (deduplicated) with new feedback: asked again
    assert asyncio.run(learner.step("default")).outcome == "no proposal"
    status = learning_status(learner.store)["default"]
    assert status["waiting"] == 1 and status["last_step"]["outcome"] == "no proposal"
    learner.store.close()


def test_a_model_proposal_becomes_a_gated_candidate(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    mutation = (
        '{"op": "create", "path": "rules/greeting.md", "content": "Greet formally.", "reason": "r"}'
    )
    learner = worker(tmp_path, engine, mutation, peer)
    record_id = failing_call(learner.store)
    result = asyncio.run(learner.step("default"))
    # No eval tasks exist, and the recipe has no scorer: the gate fails closed, unjudged.
    assert result.outcome == "rejected" and "no eval tasks" in result.detail
    assert result.retry_later and "1 record returns to learning" in result.detail
    candidate = learner.workflow.candidates.get(result.candidate_id or "")
    assert candidate.consumed_record_ids == [record_id]
    assert (Path(candidate.files_path) / "rules/greeting.md").read_text() == "Greet formally."
    assert learner.view("default").counts.waiting == 1  # its feedback is offered again
    learner.store.close()


def test_manual_mode_steps_only_for_instructions(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    learner = worker(tmp_path, engine, "nothing useful", peer, mode="manual")
    failing_call(learner.store)
    assert asyncio.run(learner.next_step("default")) is None
    queue_instruction(learner.store, "default", "be more formal")
    result = asyncio.run(learner.next_step("default"))
    assert result is not None and result.outcome == "no proposal"
    assert asyncio.run(learner.next_step("default")) is None  # the instruction was taken
    learner.store.close()


def test_a_mode_selected_at_runtime_reaches_the_worker_through_the_store(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    """`POST /reef/scenarios/{s}/update` on any replica writes the mode to the store: an `auto`
    worker switched to `manual` takes the queued instruction, and no automatic step."""
    learner = worker(tmp_path, engine, "nothing useful", peer, mode="auto")
    failing_call(learner.store)  # an auto step would run on it
    select_training_mode(learner.store, "default", "manual")
    assert asyncio.run(learner.next_step("default")) is None
    queue_instruction(learner.store, "default", "be more formal")
    result = asyncio.run(learner.next_step("default"))
    assert result is not None and result.outcome == "no proposal"
    learner.store.close()


def test_an_instruction_s_provenance_is_kept_on_the_candidate_it_leads_to(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    """`POST /reef/train`'s session, release_id and requires travel with the instruction into
    the candidate's metrics (`training_request`), with the instruction's id."""
    mutation = '{"op": "create", "path": "rules/g.md", "content": "Greet formally.", "reason": "r"}'
    learner = worker(tmp_path, engine, mutation, peer, mode="manual")
    failing_call(learner.store)
    provenance = {"session": "s-1", "release_id": "default@3"}
    request_id = queue_instruction(learner.store, "default", "greet formally", provenance)
    result = asyncio.run(learner.next_step("default"))
    assert result is not None and result.candidate_id is not None
    candidate = learner.workflow.candidates.get(result.candidate_id)
    assert candidate.metrics is not None
    assert candidate.metrics["training_request"] == {"id": request_id, **provenance}
    learner.store.close()


def test_a_recipe_generates_under_a_tree_it_is_trying(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    """`StepContext.generate_under`: the tree's harness reaches the prompt the model reads (its
    rendered length is what changes, whatever the model samples), and one tree is one folder."""
    learner = worker(tmp_path, engine, "{}", peer)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    long_rule = {"AGENTS.md": ("Always answer in formal English. " * 20).encode()}

    async def tried() -> tuple[int, int, int]:
        learner.services.loop = asyncio.get_running_loop()
        context = learner._context("default", learner.lanes["default"].learners[0].recipe, None)
        assert context.generate_under is not None
        bare = await asyncio.to_thread(context.generate_under, {}, body)
        ruled = await asyncio.to_thread(context.generate_under, long_rule, body)
        again = await asyncio.to_thread(context.generate_under, long_rule, body)
        return (
            len(bare.prompt_token_ids or []),
            len(ruled.prompt_token_ids or []),
            len(again.prompt_token_ids or []),
        )

    bare, ruled, again = asyncio.run(tried())
    assert ruled - bare >= 100 and again == ruled  # 20 sentences of 6 tokens or more
    trials = sorted((tmp_path / ".reef" / "learning" / "trials").iterdir())
    assert len(trials) == 2  # the empty tree and the ruled one, the second written once
    assert sum((t / "AGENTS.md").is_file() for t in trials) == 1
    learner.store.close()


def test_an_agent_s_proposal_is_gated_at_the_next_step_before_the_recipe_is_asked(
    tmp_path: Path, engine: Engine
) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\ngate:\n  policy: always\n  agent_proposals: gate\n"
        "learning:\n  recipe: harness_evolve\n  proposer: rule\n  batch_size: 1\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    recipe = load_recipe("harness_evolve", config.learning.recipe_settings())
    learner = LearningWorker(
        config, store, LocalModel(engine), plans=[LoadedPlan("default", "auto", [recipe])]
    )
    failing_call(store)  # the recipe is ready too: the agent's proposal still goes first
    proposed = learner.workflow.propose(
        "default", "harness", {"rules/tests.md": b"Run the tests."}, source="agent"
    )
    first = asyncio.run(learner.step("default"))
    assert (first.candidate_id, first.outcome, first.recipe) == (proposed.id, "released", "agent")
    second = asyncio.run(learner.step("default"))  # then the recipe's own step
    assert second.recipe == "harness_evolve" and second.candidate_id != proposed.id
    store.close()


def good_call(store: ExperienceStore) -> str:
    return scored_call(store, f"Hi {new_id('n')}", "Hello.", 1.0)


def test_good_answers_are_held_back_for_replay_only_where_a_gate_evaluates(
    tmp_path: Path, engine: Engine, peer: ServerProcess
) -> None:
    """Under `gate.policy: always` nothing replays a held-back answer, so none is held back (a
    recipe like sao, one step per scored rollout, waited forever for the held one)."""
    learner = worker(tmp_path, engine, "unused", peer)
    while not any(held_back(r) for r in [good_call(learner.store)]):
        pass
    assert learner.view("default").counts.held_back == 1
    learner.config = learner.config.model_copy(
        update={"gate": learner.config.gate.model_copy(update={"policy": "always"})}
    )
    view = learner.view("default")
    assert view.counts.held_back == 0 and view.counts.waiting == len(view.turns())
    learner.store.close()


class Searching(Recipe):
    """Answers its failing prompt under two trees and once as served, then proposes a rule: the
    three answers a search scores before its candidate reaches the gate."""

    name = "searching"

    def ready(self, view: ExperienceView) -> bool:
        return bool(view.turns())

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal:
        assert context.generate is not None and context.generate_under is not None
        body = {"messages": batch[0].turns[0].messages, "max_tokens": 1, "temperature": 0}
        for tree in ({}, {"AGENTS.md": b"Be formal."}):
            context.generate_under(tree, body)
        context.generate(body)
        consumed = [r for t in batch for r in t.record_ids]
        return Proposal("harness", {"AGENTS.md": b"Be formal."}, self.name, consumed)


def test_a_step_counts_its_metric_calls_the_search_s_and_the_gate_s(
    tmp_path: Path, engine: Engine
) -> None:
    """The budget recipes are compared on: each answer the recipe asked the served model for,
    and each answer of the gate's evaluation, in the step's status (`/reef/status`)."""
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(eval_tasks(["Hi", "Bye"], "."))
    spent = {}
    for policy in ("always", "no_regression"):
        (tmp_path / "reef.yaml").write_text(
            f"state_dir: {tmp_path}/.reef-{policy}\ngate:\n  policy: {policy}\n"
            "  max_tokens: 1\nlearning:\n  recipe: harness_evolve\n"
        )
        config = load_config(tmp_path / "reef.yaml", env={})
        store = ExperienceStore(config.experience_db)
        plan = LoadedPlan("default", "auto", [Searching(Searching.Settings())])
        learner = LearningWorker(config, store, LocalModel(engine), plans=[plan])
        failing_call(store)
        step = asyncio.run(learner.step("default"))
        recipe = learning_status(store)["default"]["recipes"]["searching"]
        assert recipe["last_step"]["metric_calls"] == recipe["metric_calls"] == step.metric_calls
        spent[policy] = step.metric_calls
        store.close()
    # `always` evaluates nothing; `no_regression` answers both tasks under both trees, each
    # `gate.samples` times.
    assert spent == {"always": 3, "no_regression": 3 + 2 * 2 * GateConfig().samples}


def test_a_weight_recipe_waiting_says_what_it_learns_from(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path / "experience.db")
    scored_call(store, "Hi", "Yo", 0.0, "greet me formally")  # no token ids recorded
    sdft = load_recipe("sdft", {"batch_size": 2})
    why, stuck = not_ready(sdft, ExperienceView(store, "default", consumed=set()))
    store.close()
    assert why == (
        "1 record(s) waiting, not yet a batch sdft can learn from: 0 of the 2 turns a batch "
        "needs (demonstrations and hints, distilled from the model that reads them)"
    )
    assert not stuck  # one record cannot be a batch of two
