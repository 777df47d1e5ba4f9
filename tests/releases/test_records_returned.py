"""Every signal kept: a candidate the gate never judged on its merits gives its records back to
learning; one judged and rejected spends them, or returns them when `gate.rejected_records` says
so. One test per way a candidate can end without a judgement."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from reef.config import load_config
from reef.errors import ReefError
from reef.inference.binding import Binding
from reef.protocol import ChatRequest
from reef.releases.workflow import CandidateRefused, ReleaseWorkflow
from reef.store import ExperienceStore, Record
from reef.store.candidates import Candidate

TASKS = [
    {
        "id": f"capital{n}",
        "messages": [{"role": "user", "content": f"Question {n}?"}],
        "scorer": {"type": "contains", "value": "Paris"},
    }
    for n in range(3)
]
HARNESS = {"AGENTS.md": b"Answer Paris.\n"}


def workflow_in(folder: Path, gate: str = "  policy: no_regression\n") -> ReleaseWorkflow:
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    (folder / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    text = f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\ngate:\n  min_tasks: 0\n"
    (folder / "reef.yaml").write_text(text + gate)
    config = load_config(folder / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    return ReleaseWorkflow(config, store)


@pytest.fixture
def workflow(tmp_path: Path) -> ReleaseWorkflow:
    opened = workflow_in(tmp_path)
    yield opened
    opened.candidates.store.close()


def records(workflow: ReleaseWorkflow, count: int = 2) -> list[str]:
    """Records of served calls with feedback worth learning from."""
    store = workflow.candidates.store
    return [
        store.add_record(
            Record(
                scenario="default",
                request={"messages": [{"role": "user", "content": f"Call {n}?"}]},
                response={"choices": [{"message": {"role": "assistant", "content": "Lyon"}}]},
                engine="test",
                release_id="base",
            )
        ).result()
        for n in range(count)
    ]


def propose(workflow: ReleaseWorkflow, record_ids: list[str]) -> Candidate:
    return workflow.propose("default", "harness", HARNESS, consumed_record_ids=record_ids)


def held(workflow: ReleaseWorkflow) -> set[str]:
    return workflow.candidates.consumed_record_ids("default")


def gate(workflow: ReleaseWorkflow, candidate: Candidate, current: str, proposed: str) -> Candidate:
    async def generate(request: ChatRequest, binding: Binding) -> str:
        return current if binding.kind == "base" else proposed

    return asyncio.run(workflow.gate(candidate, generate))


def test_a_candidate_holds_its_records_while_it_is_open(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    propose(workflow, ids)
    assert held(workflow) == set(ids)


def test_an_engine_that_cannot_answer_returns_the_records(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    candidate = propose(workflow, ids)

    async def unavailable(request: ChatRequest, binding: Binding) -> str:
        raise ReefError("the engine queue is full (server.max_queue)", status=503)

    gated = asyncio.run(workflow.gate(candidate, unavailable))
    assert gated.state == "rejected" and "evaluation failed" in (gated.decision or "")
    assert "2 records return to learning" in (gated.decision or "")
    assert gated.records_returned and held(workflow) == set()


def test_a_cancelled_gate_returns_the_records(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    candidate = propose(workflow, ids)
    started = asyncio.Event()

    async def slow(request: ChatRequest, binding: Binding) -> str:
        started.set()
        await asyncio.sleep(3600)
        return ""

    async def cancel_mid_gate() -> None:
        gating = asyncio.create_task(workflow.gate(candidate, slow))
        await started.wait()
        gating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gating

    asyncio.run(cancel_mid_gate())
    ended = workflow.candidates.get(candidate.id)
    assert ended.state == "rejected" and "cancelled" in (ended.decision or "")
    assert held(workflow) == set()


def test_an_evaluation_whose_process_died_returns_the_records(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    candidate = propose(workflow, ids)
    dead_pid = 2**22 + 7  # above the kernel's default pid_max: no such process
    workflow.candidates.move(candidate.id, ("proposed",), "evaluating", evaluating_pid=dead_pid)
    assert held(workflow) == set(ids)
    (recovered,) = workflow.recover_interrupted()
    assert "interrupted" in (recovered.decision or "") and held(workflow) == set()


def test_a_failed_publish_returns_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow = workflow_in(tmp_path, "  policy: always\n")
    only_git = tmp_path / "bin"
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))  # type: ignore[arg-type]
    ids = records(workflow)
    files = {"adapter.gguf": b"weights", "adapter.json": b"{}"}
    candidate = workflow.propose("default", "lora", files, consumed_record_ids=ids)
    monkeypatch.setenv("PATH", str(only_git))  # git without git-lfs: the weights cannot be stored
    gated = asyncio.run(workflow.gate(candidate, gate_never_runs))
    monkeypatch.undo()
    assert "publishing failed" in (gated.decision or "") and held(workflow) == set()
    workflow.candidates.store.close()


async def gate_never_runs(request: ChatRequest, binding: Binding) -> str:
    raise AssertionError("the always policy evaluates nothing")


def test_a_head_that_moved_during_the_gate_returns_the_records(
    workflow: ReleaseWorkflow,
) -> None:
    ids = records(workflow)
    candidate = propose(workflow, ids)

    async def another_release_lands_meanwhile(request: ChatRequest, binding: Binding) -> str:
        if workflow.chain.head("default") is None:
            workflow.chain.publish("default", "harness", {"AGENTS.md": b"Other.\n"}, None)
        return "Paris" if binding.kind != "base" else "Lyon"

    gated = asyncio.run(workflow.gate(candidate, another_release_lands_meanwhile))
    assert gated.state == "rejected" and "propose it again" in (gated.decision or "")
    assert held(workflow) == set()


def test_an_artifact_that_cannot_serve_returns_the_records(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    broken = {"AGENTS.md": b"Hi.\n", "settings.json": b'{"temperature": "hot"}'}
    with pytest.raises(CandidateRefused):
        workflow.propose("default", "harness", broken, consumed_record_ids=ids)
    assert held(workflow) == set()


def test_a_rejection_on_the_merits_spends_the_records_by_default(
    workflow: ReleaseWorkflow,
) -> None:
    ids = records(workflow)
    gated = gate(workflow, propose(workflow, ids), current="Paris", proposed="Lyon")
    assert gated.state == "rejected" and not gated.records_returned
    assert held(workflow) == set(ids)


def test_the_gate_can_return_a_rejected_candidates_records(tmp_path: Path) -> None:
    workflow = workflow_in(tmp_path, "  policy: no_regression\n  rejected_records: returned\n")
    ids = records(workflow)
    gated = gate(workflow, propose(workflow, ids), current="Paris", proposed="Lyon")
    assert gated.state == "rejected" and "return to learning" in (gated.decision or "")
    assert held(workflow) == set()
    workflow.candidates.store.close()


def test_a_human_rejection_follows_the_same_setting(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    candidate = propose(workflow, ids)
    workflow.reject(candidate.id, "not what we want")
    assert held(workflow) == set(ids)


def test_a_released_candidate_keeps_its_records(workflow: ReleaseWorkflow) -> None:
    ids = records(workflow)
    gated = gate(workflow, propose(workflow, ids), current="Lyon", proposed="Paris")
    assert gated.state == "released" and held(workflow) == set(ids)
