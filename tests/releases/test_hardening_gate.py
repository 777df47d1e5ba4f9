"""A candidate never stays `evaluating`: a gate cancelled mid-evaluation, a publish that fails,
and a real `reef release publish` killed with SIGKILL mid-evaluation, then start-up recovery."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reef.config import ReefConfig, load_config
from reef.releases.gating import gate_concurrency
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.artifacts import harness

LONG_TASKS = [
    {
        "id": f"story{n}",
        "messages": [{"role": "user", "content": f"Write a very long story number {n}."}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    for n in range(8)
]


def project(folder: Path, gate: str = "  policy: improve\n") -> Path:
    """Long generations: an evaluation that runs long enough to be killed or cancelled."""
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(task) + "\n" for task in LONG_TASKS)
    (folder / "evals/default.jsonl").write_text(lines)
    text = f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\n"
    text += "engine:\n  llamacpp:\n    n_ctx: 2048\n    n_threads: 2\n"
    (folder / "reef.yaml").write_text(text + "gate:\n  max_tokens: 1500\n" + gate)
    return folder / "reef.yaml"


def wait_for_state(store: ExperienceStore, state: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = store.query("SELECT * FROM candidates WHERE state = ?", [state])
        if rows:
            return rows[0]
        time.sleep(0.1)
    raise AssertionError(f"no candidate became {state} within {timeout}s")


@pytest.mark.e2e
def test_recovery_leaves_a_live_evaluation_alone_and_ends_a_killed_one(tmp_path: Path) -> None:
    config = load_config(project(tmp_path), env={})
    harness(tmp_path / "h", "You are brief.")
    publisher = subprocess.Popen(
        [sys.executable, "-m", "reef", "release", "publish", "h", "--kind", "harness"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with ExperienceStore(config.experience_db) as store:
            evaluating = wait_for_state(store, "evaluating")
            assert evaluating["evaluating_pid"] == publisher.pid
            workflow = ReleaseWorkflow(config, store)
            assert workflow.recover_interrupted() == []  # its process is evaluating right now
            assert workflow.candidates.get(evaluating["id"]).state == "evaluating"

            publisher.send_signal(signal.SIGKILL)
            publisher.wait()
            recovered = workflow.recover_interrupted()
            assert [c.id for c in recovered] == [evaluating["id"]]
            ended = workflow.candidates.get(evaluating["id"])
            assert ended.state == "rejected" and "interrupted" in (ended.decision or "")
    finally:
        if publisher.poll() is None:
            publisher.kill()
            publisher.wait()


def test_recovery_leaves_an_evaluation_on_another_replicas_machine_alone(tmp_path: Path) -> None:
    """A pid means something only on its own machine: a replica elsewhere sharing the store
    never ends an evaluation there as interrupted, even when no such pid runs here."""
    config = load_config(project(tmp_path), env={})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        here = workflow.propose("default", "harness", {"AGENTS.md": b"Be brief.\n"})
        there = workflow.propose("default", "harness", {"AGENTS.md": b"Be kind.\n"})
        gone = 2**22 + 17  # above the kernel's pid limit: no process has it
        for candidate, host in ((here, socket.gethostname()), (there, "another-replica")):
            workflow.candidates.move(
                candidate.id, ("proposed",), "evaluating", evaluating_pid=gone, evaluating_host=host
            )
        assert [c.id for c in workflow.recover_interrupted()] == [here.id]
        assert workflow.candidates.get(there.id).state == "evaluating"


def test_a_cancelled_gate_rejects_the_candidate_and_cancels(tmp_path: Path) -> None:
    config = load_config(project(tmp_path), env={})
    started = asyncio.Event()

    async def slow_model(*_: object) -> str:
        started.set()
        await asyncio.sleep(3600)
        return ""

    async def cancel_mid_gate(workflow: ReleaseWorkflow) -> None:
        candidate = workflow.propose("default", "harness", {"AGENTS.md": b"Be brief.\n"})
        gating = asyncio.create_task(workflow.gate(candidate, slow_model))
        await asyncio.wait_for(started.wait(), timeout=60)
        gating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gating

    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        asyncio.run(cancel_mid_gate(workflow))
        (candidate,) = workflow.candidates.list()
        assert candidate.state == "rejected"
        assert "cancelled" in (candidate.decision or "")


def test_a_failing_publish_rejects_the_candidate_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(project(tmp_path, "  policy: always\n"), env={})
    only_git = tmp_path / "bin"
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))  # type: ignore[arg-type]
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        files = {"adapter.gguf": b"weights", "adapter.json": b"{}"}
        candidate = workflow.propose("default", "lora", files)
        monkeypatch.setenv("PATH", str(only_git))  # git without git-lfs
        gated = asyncio.run(workflow.gate(candidate, _no_model))
        monkeypatch.undo()
        assert gated.state == "rejected"
        assert "publishing failed" in (gated.decision or "")
        assert "git-lfs" in (gated.decision or "")
        assert workflow.chain.head("default") is None


async def _no_model(*_: object) -> str:
    raise AssertionError("the always policy evaluates nothing")


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ({"kind": "llamacpp"}, 3),  # four slots by default: one is left to live traffic
        ({"kind": "llamacpp", "llamacpp": {"slots": 8}}, 7),
        ({"kind": "llamacpp", "llamacpp": {"slots": 1}}, 1),
        ({"kind": "upstream", "upstream": {"url": "http://127.0.0.1:9/v1"}}, 4),
    ],
)
def test_the_gate_leaves_a_llamacpp_slot_to_live_traffic(
    engine: dict[str, object], expected: int
) -> None:
    config = ReefConfig.model_validate({"engine": engine})
    assert gate_concurrency(config) == expected
