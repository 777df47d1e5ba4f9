"""Three replicas under three failures at once, for real: `reef serve` processes sharing one
PostgreSQL store and one release remote (a `file://` bare repository whose hooks make the
failures), each with a learning worker, one learner at a time by the scenario's lease.

1. The first leader's replica is killed (SIGKILL, its worker too) while its candidate is in the
   gate (the peer answers the gate's tasks slowly).
2. The next leader's worker is frozen (SIGSTOP, with its git push and the remote's receive-pack)
   in the middle of its publish, past its lease and its heartbeat.
3. The third leader's push is taken by the remote, which then drops the connection before it
   reports (a reference-transaction hook kills the receive-pack once its refs are committed).

Then the frozen worker resumes and its push reaches the remote. The end: one linear chain, whose
only release is the third leader's; every candidate final (the first two rejected, the third
released); no record consumed by a candidate that is not final, and the records of the rejected
ones trained on by the released one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from reef.store import ExperienceStore
from reef.store.candidates import OPEN_STATES, Candidate, CandidateStore
from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN
from tests.e2e.server.test_replicas import (
    ECHO_RECIPE,
    PROPAGATION_S,
    ask,
    learner_pid,
    parent_of,
    seconds_until_all_serve,
    start_replicas,
)

WAIT_S = 60.0  # each phase, with room for a slow machine
GATE_TASKS = 3  # each answered after SLOW_S: the gate takes a few seconds, a window to kill in
SLOW_S = 1.5

# pre-receive: with `pause` present, the push waits (after taking the objects, before any ref
# moves) until `resume` appears, saying so with `paused`.
PRE_RECEIVE = """#!/bin/sh
cat >/dev/null
if [ -e "{control}/pause" ]; then
  rm -f "{control}/pause"; touch "{control}/paused"
  while [ ! -e "{control}/resume" ]; do sleep 0.05; done
fi
exit 0
"""
# reference-transaction: with `drop` present, the receive-pack is killed once the refs are
# committed, before it reports: the push landed, and the pusher hears a dropped connection.
REFERENCE_TRANSACTION = """#!/bin/sh
cat >/dev/null
if [ "$1" = committed ] && [ -e "{control}/drop" ]; then
  rm -f "{control}/drop"; touch "{control}/dropped"; kill -9 $PPID
fi
exit 0
"""


def failing_remote(folder: Path) -> tuple[str, Path]:
    """A bare repository whose hooks fail as the files in its control folder say."""
    bare, control = folder / "releases-remote.git", folder / "control"
    control.mkdir()
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True)
    for name, text in (
        ("pre-receive", PRE_RECEIVE),
        ("reference-transaction", REFERENCE_TRANSACTION),
    ):
        hook = bare / "hooks" / name
        hook.write_text(text.format(control=control))
        hook.chmod(0o755)
    return f"file://{bare}", control


def chaos_replica(folder: Path, name: str) -> Path:
    """A replica's project: an Echo learner, a gate that evaluates (slowly), short leases and
    heartbeats so each failure is noticed within seconds."""
    project = folder / name
    (project / "evals").mkdir(parents=True)
    tasks = [
        {
            "messages": [{"role": "user", "content": f"sleep {SLOW_S}: question {n}"}],
            "scorer": {"type": "regex", "pattern": "question"},
        }
        for n in range(GATE_TASKS)
    ]
    (project / "evals" / "default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (project / "reef.yaml").write_text(
        "gate:\n  policy: floor\n  samples: 1\n"  # one answer a task: a gate of a few seconds
        "releases:\n  heartbeat_s: 0.5\n"
        "learning:\n  interval_s: 0.2\n  lease_s: 2.0\n"
        f"  recipe: {folder}/recipes.py:Echo\n  batch_size: 1\n"
    )
    return project


def test_three_failures_at_once_leave_one_linear_chain_and_every_candidate_final(
    tmp_path: Path, peer: ServerProcess, postgres_url: str
) -> None:
    remote_url, control = failing_remote(tmp_path)
    env = {"REEF_TOKEN": TOKEN, "REEF_STORE_URL": postgres_url, "REEF_RELEASES_REMOTE": remote_url}
    (tmp_path / "recipes.py").write_text(ECHO_RECIPE)
    folders = [chaos_replica(tmp_path, f"replica-{n}") for n in range(3)]
    replicas = start_replicas(folders, peer, env)
    frozen: list[int] = []
    try:
        with ExperienceStore(postgres_url) as store:
            candidates = CandidateStore(store)
            ask(replicas[0])  # the one record every leader learns from in turn

            # 1. The first leader's replica dies in the gate.
            first = wait_for(lambda: in_state(candidates, "evaluating"), "a first gate")
            killed = replica_of(learner_pid(replicas[0]), replicas)
            kill_with_worker(killed, learner_pid(replicas[0]))
            alive = [r for r in replicas if r is not killed]

            # 2. The next leader freezes mid-publish, past its lease and heartbeat.
            (control / "pause").touch()
            wait_for(lambda: (control / "paused").exists(), "a publish to reach the remote")
            second_leader = learner_pid(alive[0])
            os.kill(second_leader, signal.SIGSTOP)  # first: a stopped process starts no child
            frozen = [second_leader, *stopped(descendants(second_leader))]
            paused = replica_of(second_leader, alive)
            third = next(r for r in alive if r is not paused)

            # 3. The third leader's push lands and its connection drops.
            (control / "drop").touch()
            took = seconds_until_all_serve([third], "default@1")
            assert took < PROPAGATION_S, "the third leader's release did not serve"
            assert (control / "dropped").exists()  # its push did hear a dropped connection
            assert learner_pid(third) != second_leader

            # The frozen worker wakes up and its push reaches the remote; its replica, whose
            # copy of the chain the frozen push held, catches up.
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            frozen = []
            (control / "resume").touch()
            ended = wait_for(lambda: all_final(candidates), "every candidate to be final")
            took = seconds_until_all_serve(alive, "default@1")
            assert took < PROPAGATION_S, "a replica alive does not serve the chain's head"
            consumed_by_open = store.query(
                "SELECT record_id FROM candidate_records cr JOIN candidates c "
                "ON c.id = cr.candidate_id WHERE c.state IN ("
                + ", ".join("?" * len(OPEN_STATES))
                + ")",
                list(OPEN_STATES),
            )
        chain = remote_chain(remote_url)
    except BaseException:
        show_what_happened(postgres_url, replicas)
        raise
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):  # what failed is said above
                os.kill(pid, signal.SIGCONT)
        for replica in replicas:
            replica.stop()

    by_state = {c.id: c.state for c in ended}
    released = [c for c in ended if c.state == "released"]
    assert len(released) == 1, by_state
    assert sorted(by_state.values()) == ["rejected", "rejected", "released"], by_state
    assert by_state[first.id] == "rejected"  # the one killed in its gate
    assert consumed_by_open == []
    # Every rejected candidate's record went back, and the released one learned from it.
    record = released[0].consumed_record_ids
    assert all(c.records_returned for c in ended if c.state == "rejected")
    assert all(c.consumed_record_ids == record for c in ended)
    # One linear chain on the remote: one release, the released candidate's.
    assert len(chain) == 1 and all(len(parents) <= 1 for parents in chain), chain


def show_what_happened(store_url: str, replicas: list[ServerProcess]) -> None:
    """The candidates and the replicas' logs, for a failure's report."""
    with ExperienceStore(store_url) as store:
        for c in CandidateStore(store).list():
            print("candidate", c.id, c.state, c.decision, c.records_returned, c.consumed_record_ids)
    for replica in replicas:
        print(f"--- {replica.url}\n{replica.log()[-3000:]}")


def wait_for(found: Callable[[], object], what: str) -> object:
    deadline = time.monotonic() + WAIT_S
    while not (result := found()):
        assert time.monotonic() < deadline, f"waited {WAIT_S:.0f} s for {what}"
        time.sleep(0.05)
    return result


def in_state(candidates: CandidateStore, state: str) -> Candidate | None:
    return next(iter(candidates.list(scenario="default", state=state)), None)


def all_final(candidates: CandidateStore) -> list[Candidate] | None:
    listed = candidates.list(scenario="default")
    return listed if len(listed) == 3 and all(c.state not in OPEN_STATES for c in listed) else None


def replica_of(worker: int, replicas: list[ServerProcess]) -> ServerProcess:
    return next(r for r in replicas if r.process and r.process.pid == parent_of(worker))


def kill_with_worker(replica: ServerProcess, worker: int) -> None:
    replica.kill()
    subprocess.run(["kill", "-9", str(worker)], check=False)  # its worker too: no goodbye


def stopped(pids: list[int]) -> list[int]:
    """SIGSTOP each of `pids` still running; those stopped. A git child listed a moment before
    may have ended since (one did, in a full run)."""
    done = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            done.append(pid)
    return done


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its git push, the receive-pack, the hook)."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:
            continue
        children.setdefault(int(fields["PPid"]), []).append(int(fields["Pid"]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def remote_chain(remote_url: str) -> list[list[str]]:
    """The remote head's history, newest first: each commit's parents."""
    lines = subprocess.run(
        ["git", "rev-list", "--parents", "refs/reef/default/head"],
        cwd=remote_url.removeprefix("file://"),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return [line.split()[1:] for line in lines]
