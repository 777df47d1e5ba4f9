"""The server ends, while it runs, the evaluations a process that died left behind: a candidate
whose heartbeat stopped (by the database's clock) on a machine whose pid cannot be checked from
here is rejected unjudged by the running server's recovery, without a restart."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from reef.config import load_config
from reef.daemon.recovery import InterruptedRecovery
from reef.engines import build_engine
from reef.releases.workflow import HEARTBEAT_MISSES, ReleaseWorkflow
from reef.server.state import ServerState
from reef.store import ExperienceStore
from reef.store.candidates import Candidate


def left_evaluating(workflow: ReleaseWorkflow, text: bytes, stale: bool) -> Candidate:
    candidate = workflow.propose("default", "harness", {"AGENTS.md": text})
    workflow.candidates.move(
        candidate.id, ("proposed",), "evaluating", evaluating_pid=1, evaluating_host="reef-old"
    )
    assert workflow.beat(candidate.id)
    if stale:
        ago = HEARTBEAT_MISSES * workflow.config.releases.heartbeat_s + 5
        workflow.candidates.store.write(
            lambda db: db.execute(
                f"UPDATE candidates SET evaluation_heartbeat_at = {db.sql_now()} - ? WHERE id = ?",
                [ago, candidate.id],
            )
        ).result()
    return candidate


def test_the_running_server_ends_an_evaluation_whose_heartbeat_stopped(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\nengine:\n  kind: upstream\n  upstream:\n"
        "    url: http://127.0.0.1:9/v1\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        state = ServerState(config, build_engine(config.engine), store, workflow)
        alive = left_evaluating(workflow, b"A.\n", stale=False)
        gone = left_evaluating(workflow, b"B.\n", stale=True)

        async def recovered_on_its_own() -> None:
            following = asyncio.create_task(InterruptedRecovery(state, interval_s=0.05).follow())
            try:
                for _ in range(200):
                    if workflow.candidates.get(gone.id).state != "evaluating":
                        return
                    await asyncio.sleep(0.05)
            finally:
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following

        asyncio.run(recovered_on_its_own())
        ended = workflow.candidates.get(gone.id)
        assert ended.state == "rejected" and ended.unjudged
        assert "interrupted" in (ended.decision or "")
        assert workflow.candidates.get(alive.id).state == "evaluating"  # its heartbeat goes on
        assert InterruptedRecovery(state).once() == []  # nothing more to end
