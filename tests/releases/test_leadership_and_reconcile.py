"""Publishing under races and failures, with the real git (a `file://` bare remote) and real
stores: a leader whose lease generation went stale cannot publish, whatever the remote's head;
a push the remote took but reported as failed leaves its candidate released (in the gate and at
start-up recovery), its records kept; an evaluation whose heartbeat stopped is ended by any
replica whatever its host, one whose heartbeat goes on is left alone (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.config import load_config
from reef.inference.binding import Binding
from reef.protocol import ChatRequest
from reef.releases.chain import ReleaseChain, ReleaseConflict
from reef.releases.remote import MIRROR, ReleaseRemote, RemoteUnreachable
from reef.releases.workflow import HEARTBEAT_MISSES, ReleaseWorkflow
from reef.store import ExperienceStore
from reef.store.leases import LeaseLost, confirm_lease, new_holder, take_lease
from tests.releases.test_records_returned import records

HARNESS = {"AGENTS.md": b"Be brief.\n"}
LEASE = "learner:default"


@pytest.fixture
def remote_url(tmp_path: Path) -> str:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True)
    return f"file://{bare}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return tmp_path / "experience.db"


def remote_head(remote_url: str, scenario: str = "default") -> str | None:
    output = subprocess.run(
        ["git", "ls-remote", remote_url, f"refs/reef/{scenario}/head"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return output.split("\t", 1)[0] if output else None


def fence_of(store: ExperienceStore, holder: str, generation: int) -> Any:
    return lambda: confirm_lease(store, LEASE, holder, generation, period_s=60)


# -- (a) the lease is a fence -------------------------------------------------------------------


@pytest.mark.parametrize("new_leader_publishes_first", [False, True])
def test_a_leader_paused_past_its_lease_cannot_publish_and_the_new_leaders_release_stands(
    tmp_path: Path, remote_url: str, new_leader_publishes_first: bool
) -> None:
    """The old leader's publish pauses after its LFS push, right before its fence (a long push
    while its renewals stopped); its lease expires and another replica takes it. Released, the
    old leader's fence refuses: `LeaseLost`, nothing of it on the remote or here. Without the
    fence, the first order (the new leader has not published yet) would land the old one's."""
    with ExperienceStore(tmp_path / "experience.db") as store:
        old_chain = ReleaseChain(tmp_path / "old" / "releases.git", remote_url)
        new_chain = ReleaseChain(tmp_path / "new" / "releases.git", remote_url)
        old, new = new_holder(), new_holder()
        old_generation = take_lease(store, LEASE, old, period_s=0.3)
        assert old_generation >= 1

        at_fence, go_on = threading.Event(), threading.Event()
        real_fence = fence_of(store, old, old_generation)

        def paused_fence() -> None:
            at_fence.set()
            assert go_on.wait(30)
            real_fence()

        outcome: dict[str, BaseException | None] = {}

        def old_leader_publishes() -> None:
            try:
                old_chain.publish(
                    "default", "harness", {"AGENTS.md": b"Old.\n"}, None, fence=paused_fence
                )
                outcome["error"] = None
            except BaseException as error:
                outcome["error"] = error

        publishing = threading.Thread(target=old_leader_publishes)
        publishing.start()
        assert at_fence.wait(30)
        time.sleep(0.4)  # past the old leader's lease: nobody renewed it
        new_generation = take_lease(store, LEASE, new, period_s=60)
        assert new_generation == old_generation + 1
        new_fence = fence_of(store, new, new_generation)
        if new_leader_publishes_first:
            new_release = new_chain.publish("default", "harness", HARNESS, None, fence=new_fence)
        go_on.set()
        publishing.join(60)
        assert not publishing.is_alive()
        assert isinstance(outcome["error"], LeaseLost)  # the fence, not the remote, refused
        assert old_chain.head("default") is None  # nothing moved here
        if not new_leader_publishes_first:
            assert remote_head(remote_url) is None  # nor on the remote
            new_release = new_chain.publish("default", "harness", HARNESS, None, fence=new_fence)
        assert remote_head(remote_url) == new_release.commit
        old_chain.catch_up()
        assert old_chain.head("default").release_id == new_release.release_id  # type: ignore[union-attr]
        assert old_chain.files(new_release.release_id) == HARNESS


def test_the_remote_refuses_a_push_whose_expected_head_moved_after_the_fence_passed(
    tmp_path: Path, remote_url: str
) -> None:
    """The fence's limit: once it passed, the remote's expected-old-head check (a
    `--force-with-lease`) is what stops a push whose view went stale meanwhile."""
    first = ReleaseChain(tmp_path / "a" / "releases.git", remote_url)
    second = ReleaseChain(tmp_path / "b" / "releases.git", remote_url)

    def another_lands_after_the_fence() -> None:
        second.publish("default", "harness", HARNESS, None)

    with pytest.raises(ReleaseConflict):
        first.publish(
            "default",
            "harness",
            {"AGENTS.md": b"Late.\n"},
            None,
            fence=another_lands_after_the_fence,
        )
    assert first.head("default").release_id == "default@1"  # type: ignore[union-attr]
    assert first.files("default@1") == HARNESS  # the other's, fetched on the refusal


def test_a_long_lfs_upload_leaves_the_copy_free_to_catch_up(
    tmp_path: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a worker uploads a release's weights (git lfs push: up to half an hour), the
    server sharing its copy of the chain still follows what other replicas publish: the upload
    holds none of the copy's locks."""
    copy = tmp_path / "replica" / "releases.git"
    worker, server = ReleaseChain(copy, remote_url), ReleaseChain(copy, remote_url)
    elsewhere = ReleaseChain(tmp_path / "elsewhere" / "releases.git", remote_url)
    uploading, uploaded = threading.Event(), threading.Event()
    assert worker.remote is not None
    real_upload = worker.remote._push_lfs

    def long_upload(commit: str) -> None:
        uploading.set()
        assert uploaded.wait(30)
        real_upload(commit)

    monkeypatch.setattr(worker.remote, "_push_lfs", long_upload)
    publishing = threading.Thread(
        target=lambda: worker.publish("learned", "harness", HARNESS, None)
    )
    publishing.start()
    try:
        assert uploading.wait(30)
        released = elsewhere.publish("default", "harness", HARNESS, None)
        caught_up = threading.Thread(target=server.catch_up, daemon=True)
        caught_up.start()
        caught_up.join(10)
        assert not caught_up.is_alive(), "the server waited for the worker's upload"
        assert server.head("default").release_id == released.release_id  # type: ignore[union-attr]
    finally:
        uploaded.set()
        publishing.join(60)
    assert worker.head("learned").release_id == "learned@1"  # type: ignore[union-attr]


# -- (b) a push that landed but reported failure ------------------------------------------------


def workflow_with_remote(folder: Path, remote_url: str) -> ReleaseWorkflow:
    text = (
        f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\n"
        f"gate:\n  policy: always\nreleases:\n  remote: {remote_url}\n"
    )
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    (folder / "reef.yaml").write_text(text)
    config = load_config(folder / "reef.yaml", env={})
    return ReleaseWorkflow(config, ExperienceStore(config.experience_db))


async def gate_never_runs(request: ChatRequest, binding: Binding) -> str:
    raise AssertionError("the always policy evaluates nothing")


def push_reports_failure(remote: ReleaseRemote, monkeypatch: pytest.MonkeyPatch) -> None:
    """The push reaches the remote, which takes it; then git says it failed (the connection
    dropped before the answer came)."""
    real = remote._run

    def run(timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
        result = real(timeout, *args)
        if args[0] == "push":
            assert result.returncode == 0, result.stderr
            return subprocess.CompletedProcess(args, 1, "", "fatal: the remote end hung up")
        return result

    monkeypatch.setattr(remote, "_run", run)


def mirror_update_fails(remote: ReleaseRemote, monkeypatch: pytest.MonkeyPatch) -> None:
    """The push landed and said so; updating the local mirror of the remote's refs fails."""
    real = remote._git

    def git(timeout: float, *args: str) -> str:
        if args[0] == "update-ref" and args[1].startswith(MIRROR):
            raise RemoteUnreachable("cannot lock ref: No space left on device")
        return real(timeout, *args)

    monkeypatch.setattr(remote, "_git", git)


@pytest.mark.parametrize("failure", [push_reports_failure, mirror_update_fails])
def test_a_push_the_remote_took_is_a_publish_that_succeeded(
    tmp_path: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch, failure: Any
) -> None:
    """The remote is asked before a failure is believed: the publish returns, the head moves."""
    chain = ReleaseChain(tmp_path / "a" / "releases.git", remote_url)
    assert chain.remote is not None
    failure(chain.remote, monkeypatch)
    published = chain.publish("default", "harness", HARNESS, None)
    monkeypatch.undo()
    assert remote_head(remote_url) == published.commit
    assert chain.head("default").release_id == published.release_id  # type: ignore[union-attr]


@pytest.mark.parametrize("failure", [push_reports_failure, mirror_update_fails])
def test_a_push_the_remote_took_but_reported_failed_leaves_the_candidate_released(
    tmp_path: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch, failure: Any
) -> None:
    workflow = workflow_with_remote(tmp_path, remote_url)
    try:
        ids = records(workflow)
        candidate = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids)
        assert workflow.chain.remote is not None
        failure(workflow.chain.remote, monkeypatch)
        gated = asyncio.run(workflow.gate(candidate, gate_never_runs))
        monkeypatch.undo()
        assert gated.state == "released", gated.decision
        assert not gated.records_returned
        assert workflow.candidates.consumed_record_ids("default") == set(ids)
        head = workflow.chain.head("default")
        assert head is not None and head.candidate_id == candidate.id
        assert remote_head(remote_url) == head.commit  # what every replica serves
        assert gated.release_id == head.release_id
    finally:
        workflow.candidates.store.close()


def test_a_push_that_lands_after_a_recovery_ended_its_candidate_releases_it_again(
    tmp_path: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher froze after its fence, in its ref push; a recovery elsewhere saw the
    heartbeat stop and, the release not on the remote yet, rejected the candidate and handed its
    records back. Then the push landed: every replica serves that release, so its candidate is
    released again, with its records consumed, not left rejected with them back in learning."""
    workflow = workflow_with_remote(tmp_path, remote_url)
    try:
        ids = records(workflow)
        candidate = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids)
        assert workflow.chain.remote is not None
        real = workflow.chain.remote._run

        def run(timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
            if args[0] == "push":  # frozen past its heartbeat: another replica recovers
                ended = workflow._end_evaluation(workflow.candidates.get(candidate.id), "lost")
                assert ended.state == "rejected" and ended.records_returned
            return real(timeout, *args)

        monkeypatch.setattr(workflow.chain.remote, "_run", run)
        gated = asyncio.run(workflow.gate(candidate, gate_never_runs))
        monkeypatch.undo()
        head = workflow.chain.head("default")
        assert head is not None and remote_head(remote_url) == head.commit
        assert gated.state == "released", gated.decision
        assert gated.release_id == head.release_id
        assert not gated.records_returned
        assert workflow.candidates.consumed_record_ids("default") == set(ids)
    finally:
        workflow.candidates.store.close()


def test_recovery_after_a_crash_once_the_push_landed_leaves_the_candidate_released(
    tmp_path: Path, remote_url: str
) -> None:
    """The process died after the remote took its push, before anything moved here or in the
    store: its candidate is `evaluating`, its process gone, and this copy of the chain has not
    seen the release (recovery runs before the server's first catch-up). Recovery asks the
    remote, and the candidate ends released, its records still consumed."""
    workflow = workflow_with_remote(tmp_path, remote_url)
    try:
        ids = records(workflow)
        candidate = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids)
        dead_pid = 2**22 + 7  # above the kernel's default pid_max: no such process
        workflow.candidates.move(candidate.id, ("proposed",), "evaluating", evaluating_pid=dead_pid)
        # What the dead process had pushed, from a copy of its own (this one never moved).
        pushed = ReleaseChain(tmp_path / "crashed" / "releases.git", remote_url).publish(
            "default", "harness", HARNESS, None, candidate_id=candidate.id, reason="always"
        )
        assert workflow.chain.head("default") is None
        (recovered,) = workflow.recover_interrupted()
        assert recovered.state == "released", recovered.decision
        assert recovered.release_id == pushed.release_id and not recovered.records_returned
        assert workflow.candidates.consumed_record_ids("default") == set(ids)
        assert workflow.chain.head("default").commit == pushed.commit  # type: ignore[union-attr]
    finally:
        workflow.candidates.store.close()


def test_recovery_with_the_remote_unreachable_decides_nothing(tmp_path: Path) -> None:
    """Nobody can tell whether the push landed: the candidate stays evaluating, its records
    consumed, for a later recovery to decide."""
    workflow = workflow_with_remote(tmp_path, f"file://{tmp_path}/nowhere.git")
    try:
        ids = records(workflow)
        candidate = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids)
        dead_pid = 2**22 + 7
        workflow.candidates.move(candidate.id, ("proposed",), "evaluating", evaluating_pid=dead_pid)
        assert workflow.recover_interrupted() == []
        assert workflow.candidates.get(candidate.id).state == "evaluating"
        assert workflow.candidates.consumed_record_ids("default") == set(ids)
    finally:
        workflow.candidates.store.close()


# -- (c) the evaluation heartbeat -----------------------------------------------------------------


@pytest.fixture
def workflow_on(store_location: Path | str, tmp_path: Path) -> Iterator[ReleaseWorkflow]:
    (tmp_path / "evals").mkdir()
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\nevals_dir: {tmp_path}/evals\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    with ExperienceStore(store_location) as store:
        yield ReleaseWorkflow(config, store)


def test_an_evaluation_whose_heartbeat_stopped_is_ended_whatever_its_host(
    workflow_on: ReleaseWorkflow,
) -> None:
    """A pod that restarted under a new hostname left one evaluation (its heartbeat stopped);
    another replica's evaluation goes on (its heartbeat is fresh). Both on machines whose pids
    cannot be checked from here: the heartbeat alone decides."""
    workflow = workflow_on
    store = workflow.candidates.store
    ids = records(workflow, 4)
    gone = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids[:2])
    alive = workflow.propose(
        "default", "harness", {"AGENTS.md": b"B.\n"}, consumed_record_ids=ids[2:]
    )
    for candidate, host in ((gone, "reef-7f9c-old"), (alive, "reef-7f9c-other")):
        workflow.candidates.move(
            candidate.id, ("proposed",), "evaluating", evaluating_pid=1, evaluating_host=host
        )
        assert workflow.beat(candidate.id)
    stale_s = HEARTBEAT_MISSES * workflow.config.releases.heartbeat_s + 5
    store.write(
        lambda db: db.execute(
            f"UPDATE candidates SET evaluation_heartbeat_at = {db.sql_now()} - ? WHERE id = ?",
            [stale_s, gone.id],
        )
    ).result()
    (ended,) = workflow.recover_interrupted()
    assert ended.id == gone.id and ended.state == "rejected"
    assert "interrupted" in (ended.decision or "") and ended.records_returned
    assert workflow.candidates.get(alive.id).state == "evaluating"
    assert workflow.candidates.consumed_record_ids("default") == set(ids[2:])
    assert workflow.candidates.get(alive.id).evaluation_heartbeat_at is not None


def test_a_gate_beats_while_it_evaluates(
    workflow_on: ReleaseWorkflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat goes on on its own thread while the event loop is held (here: blocked in a
    generate call), and stops once the gate ended."""
    workflow = workflow_on
    monkeypatch.setattr(workflow.config.releases, "heartbeat_s", 0.05)
    (workflow.config.evals_dir / "default.jsonl").write_text(
        json.dumps(
            {
                "id": "t",
                "messages": [{"role": "user", "content": "Q?"}],
                "scorer": {"type": "contains", "value": "Paris"},
            }
        )
        + "\n"
    )
    candidate = workflow.propose("default", "harness", HARNESS)
    beats: list[float | None] = []

    async def blocking(request: ChatRequest, binding: Binding) -> str:
        for _ in range(3):
            time.sleep(0.2)  # holds the loop
            beats.append(workflow.candidates.get(candidate.id).evaluation_heartbeat_at)
        return "Paris"

    gated = asyncio.run(workflow.gate(candidate, blocking))
    assert gated.state != "evaluating"
    assert None not in beats and len(set(beats)) >= 2  # renewed while the loop was held


def test_a_gate_whose_fence_refuses_publishes_nothing_and_returns_the_records(
    tmp_path: Path, remote_url: str
) -> None:
    """The learner's step lost its lease mid-gate: the candidate ends rejected unjudged, its
    records back to learning (the new leader learns from them), nothing on the remote."""
    workflow = workflow_with_remote(tmp_path, remote_url)
    store = workflow.candidates.store
    try:
        ids = records(workflow)
        stale = take_lease(store, LEASE, new_holder(), period_s=0.01)
        time.sleep(0.05)
        assert take_lease(store, LEASE, new_holder(), period_s=60) == stale + 1
        candidate = workflow.propose("default", "harness", HARNESS, consumed_record_ids=ids)
        fence = fence_of(store, "someone-else", stale)
        gated = asyncio.run(workflow.gate(candidate, gate_never_runs, fence=fence))
        assert gated.state == "rejected" and "LeaseLost" in (gated.decision or "")
        assert (
            gated.records_returned and workflow.candidates.consumed_record_ids("default") == set()
        )
        assert remote_head(remote_url) is None and workflow.chain.head("default") is None
    finally:
        store.close()
