"""Candidates through the gate, on a scripted engine (its answers cut at max_tokens as an engine
cuts them), real SQLite and a real git chain."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.config import ReefConfig, load_config
from reef.engines.base import Engine
from reef.errors import Conflict
from reef.evaluation.runner import model_generate
from reef.inference.model import LocalModel
from reef.releases.chain import ReleaseConflict, read_folder
from reef.releases.door import GateScoredWorse
from reef.releases.workflow import ReleaseWorkflow, StaleCandidate
from reef.store import ExperienceStore
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess
from reef.testing.scripted_engine import ScriptedEngine

STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
SHORT = {"type": "python", "function": "tests.support.scorers:short"}
# Short answers win: a harness whose settings cap max_tokens is "better" on these tasks.
SHORT_TASKS = [{"id": f"t{n}", "messages": STORY, "scorer": SHORT} for n in range(2)]


def project(folder: Path, tasks: list[dict], gate: str = "", extra: str = "") -> ReefConfig:
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    (folder / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    text = f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\n" + extra
    text += "gate:\n  max_tokens: 48\n" + gate
    (folder / "reef.yaml").write_text(text)
    return load_config(folder / "reef.yaml", env={})


# 20 words, 100 characters: cut at 3 tokens it is short (tests.support.scorers:short), whole not.
STORY_TOLD = (
    "Once upon a time a lighthouse keeper watched the sea every night and wrote down what the "
    "waves told him."
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return ScriptedEngine(STORY_TOLD)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ExperienceStore]:
    with ExperienceStore(tmp_path / ".reef/experience.db") as opened:
        yield opened


def gate(workflow: ReleaseWorkflow, engine: Engine, folder: Path):  # type: ignore[no-untyped-def]
    candidate = workflow.propose("default", "harness", read_folder(folder))
    generate = model_generate(LocalModel(engine), workflow.eval_settings("default"))
    return asyncio.run(workflow.gate(candidate, generate))


def test_better_candidate_is_released_and_worse_one_rejected(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS), store)
    better = harness(tmp_path / "short", "You answer briefly.", {"max_tokens": 3})
    released = gate(workflow, engine, better)
    assert released.state == "released", released.decision
    assert released.release_id == "default@1"
    head = workflow.chain.head("default")
    assert head is not None and head.candidate_id == released.id
    assert head.evaluation["candidate_mean"] == 1.0 and head.evaluation["current_mean"] == 0.0
    assert head.evaluation["current_release_id"] == "base"

    worse = harness(tmp_path / "long", "You answer at length.", {"max_tokens": 48})
    rejected = gate(workflow, engine, worse)
    assert rejected.state == "rejected"
    lost = "lost 2 task(s) of group default against the best released: t0 (8/8 -> 0/8), t1"
    assert lost in (rejected.decision or "")
    assert rejected.evaluation["current_release_id"] == "default@1"
    assert workflow.chain.head("default").release_id == "default@1"  # type: ignore[union-attr]


def test_a_crashing_evaluator_rejects(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    tasks = [
        {
            "messages": STORY,
            "scorer": {"type": "python", "function": "tests.support.scorers:explode"},
        }
    ]
    workflow = ReleaseWorkflow(project(tmp_path, tasks), store)
    candidate = gate(workflow, engine, harness(tmp_path / "h", "Hi.", {"max_tokens": 2}))
    assert candidate.state == "rejected"
    assert "evaluation failed" in candidate.decision and "always fails" in candidate.decision
    assert workflow.chain.head("default") is None


def test_missing_eval_tasks_reject(tmp_path: Path, store: ExperienceStore, engine: Engine) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS), store)
    (tmp_path / "evals/default.jsonl").unlink()
    candidate = gate(workflow, engine, harness(tmp_path / "h", "Hi.", {"max_tokens": 2}))
    assert candidate.state == "rejected" and "no eval tasks" in candidate.decision


def test_review_holds_until_a_human_approves(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS, "  policy: review\n"), store)
    held = gate(workflow, engine, harness(tmp_path / "h", "Brief.", {"max_tokens": 3}))
    assert held.state == "held" and workflow.chain.head("default") is None
    assert held.evaluation and held.evaluation["candidate_mean"] == 1.0
    approved = workflow.approve(held.id, "looks right")
    assert approved.state == "released" and approved.release_id == "default@1"
    with pytest.raises(Conflict, match="released"):
        workflow.approve(held.id)


def test_a_rejected_candidate_keeps_its_evaluation_and_the_reviewers_reason(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS, "  policy: review\n"), store)
    held = gate(workflow, engine, harness(tmp_path / "h", "Brief.", {"max_tokens": 3}))
    assert held.evaluation is not None
    rejected = workflow.reject(held.id, "it drops the greeting")
    assert rejected.decision == "rejected by a human: it drops the greeting"
    assert rejected.evaluation == held.evaluation  # the evidence the reviewer read stays


def test_approving_a_candidate_the_gate_scored_worse_needs_force(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS, "  policy: review\n"), store)
    short = gate(workflow, engine, harness(tmp_path / "s", "Brief.", {"max_tokens": 3}))
    workflow.approve(short.id)
    worse = gate(workflow, engine, harness(tmp_path / "l", "Long.", {"max_tokens": 48}))
    assert worse.state == "held"
    with pytest.raises(GateScoredWorse, match=r"scored 0.000 against the current 1.000 and lost 2"):
        workflow.approve(worse.id)
    assert workflow.candidates.get(worse.id).state == "held"
    forced = workflow.approve(worse.id, "the user wants long stories", force=True)
    assert forced.state == "released" and forced.release_id == "default@2"
    assert "forced: it scored 0.000 against the current 1.000" in forced.decision


def test_a_candidate_built_on_a_moved_head_is_refused_and_regated_on_the_new_one(
    tmp_path: Path, store: ExperienceStore, engine: Engine
) -> None:
    workflow = ReleaseWorkflow(project(tmp_path, SHORT_TASKS, "  policy: review\n"), store)
    first = gate(workflow, engine, harness(tmp_path / "a", "A.", {"max_tokens": 3}))
    second = gate(workflow, engine, harness(tmp_path / "b", "B.", {"max_tokens": 3}))
    workflow.approve(first.id)
    with pytest.raises(StaleCandidate, match=f"default@1.*reef release regate {second.id}") as no:
        workflow.approve(second.id)  # built on base; the head is now default@1
    assert isinstance(no.value, ReleaseConflict)  # the CLI's exit 3
    assert workflow.candidates.get(second.id).state == "held"  # refused: nothing moved
    generate = model_generate(LocalModel(engine), workflow.eval_settings("default"))
    old, regated = asyncio.run(workflow.regate(second.id, generate))
    assert old.state == "rejected" and regated.id in (old.decision or "")
    assert old.evaluation == second.evaluation  # the evidence stays with the superseded one
    assert regated.base_release_id == "default@1" and regated.state == "held"
    assert read_folder(regated.folder)["AGENTS.md"] == b"B.\n"
    assert workflow.approve(regated.id).release_id == "default@2"


def test_floor_and_always_policies(tmp_path: Path, store: ExperienceStore, engine: Engine) -> None:
    workflow = ReleaseWorkflow(
        project(tmp_path, SHORT_TASKS, "  policy: floor\n  floor: 1.0\n"), store
    )
    assert (
        gate(workflow, engine, harness(tmp_path / "a", "A.", {"max_tokens": 48})).state
        == "rejected"
    )
    assert (
        gate(workflow, engine, harness(tmp_path / "b", "B.", {"max_tokens": 2})).state == "released"
    )
    always = ReleaseWorkflow(project(tmp_path, [], "  policy: always\n"), store)
    assert gate(always, engine, harness(tmp_path / "c", "C.")).release_id == "default@2"


def test_candidates_persist_across_restarts(tmp_path: Path, engine: Engine) -> None:
    config = project(tmp_path, SHORT_TASKS, "  policy: review\n")
    with ExperienceStore(config.experience_db) as store:
        held = gate(ReleaseWorkflow(config, store), engine, harness(tmp_path / "h", "H.", {}))
    with ExperienceStore(config.experience_db) as store:
        again = ReleaseWorkflow(config, store).candidates.get(held.id)
    assert again.state == "held" and again.evaluation == held.evaluation


def test_judge_scorer_asks_an_openai_compatible_model(
    tmp_path: Path, store: ExperienceStore, engine: Engine, peer: ServerProcess
) -> None:
    judge = {
        "type": "judge",
        "criterion": "is polite",
        "url": f"{peer.url}/v1",
        "model": "reply:0.75",
    }
    workflow = ReleaseWorkflow(
        project(
            tmp_path, [{"messages": STORY, "scorer": judge}], "  policy: floor\n  floor: 0.7\n"
        ),
        store,
    )
    candidate = gate(workflow, engine, harness(tmp_path / "h", "Be polite.", {"max_tokens": 2}))
    assert candidate.state == "released", candidate.decision
    assert candidate.evaluation["candidate_mean"] == 0.75


def test_decided_candidate_folders_beyond_retention_are_pruned(
    tmp_path: Path, store: ExperienceStore
) -> None:
    config = project(tmp_path, [], "  policy: review\n", "retention:\n  candidates: 2\n")
    workflow = ReleaseWorkflow(config, store)

    def propose(n: int) -> str:
        return workflow.propose("default", "harness", {"AGENTS.md": f"{n}\n".encode()}).id

    decided = [propose(n) for n in range(4)]
    for candidate_id in decided:
        workflow.reject(candidate_id, "not this one")
    waiting = propose(4)
    folders = {p.name for p in (config.state_dir / "candidates").iterdir()}
    assert folders == {decided[2], decided[3], waiting}  # the two newest decided, and the open
    workflow.approve(waiting, force=True)  # never evaluated: a named decision
    folders = {p.name for p in (config.state_dir / "candidates").iterdir()}
    assert folders == {decided[3], waiting}


def test_checkouts_keep_the_heads_and_the_newest_others(
    tmp_path: Path, store: ExperienceStore
) -> None:
    config = project(tmp_path, [], "  policy: always\n", "retention:\n  checkouts: 1\n")
    workflow = ReleaseWorkflow(config, store)
    parent = None
    for n in range(4):
        release = workflow.chain.publish("a", "harness", {"AGENTS.md": f"{n}".encode()}, parent)
        workflow.binding(release)
        parent = release.release_id
    workflow.binding(workflow.chain.publish("b", "harness", {"AGENTS.md": b"b"}, None))
    assert sorted(p.name for p in workflow.checkouts.iterdir()) == ["a@3", "a@4", "b@1"]
    # The binding of a pruned release checks it out again.
    binding = workflow.binding(workflow.chain.get("a@1"))
    assert binding.system_prompt == "0"


def test_a_candidate_rejected_while_it_evaluates_stops_its_gate(tmp_path: Path) -> None:
    """Issue 75: a candidate that is evaluating could not be rejected. Rejected from another
    thread (any process: the gate reads the store), its gate stops before its tasks are all
    answered, and the human's decision stands."""
    tasks = [{"id": f"t{n}", "messages": STORY, "scorer": SHORT} for n in range(8)]
    config = project(tmp_path, tasks, "  samples: 1\n", "releases:\n  heartbeat_s: 0.2\n")
    slow = ScriptedEngine(STORY_TOLD, delay_s=0.3)
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        candidate = workflow.propose(
            "default", "harness", read_folder(harness(tmp_path / "h", "Hi."))
        )

        async def gate_and_reject() -> str:
            generate = model_generate(LocalModel(slow), workflow.eval_settings("default"))
            gating = asyncio.ensure_future(workflow.gate(candidate, generate))
            while workflow.candidates.get(candidate.id).state != "evaluating":
                await asyncio.sleep(0.05)
            await asyncio.to_thread(workflow.reject, candidate.id, "not what we asked")
            return (await gating).state

        assert asyncio.run(gate_and_reject()) == "rejected"
        ended = workflow.candidates.get(candidate.id)
    assert ended.decision == "rejected by a human while it was evaluated: not what we asked"
    assert len(slow.calls) < 2 * len(tasks)  # stopped before every task was answered
