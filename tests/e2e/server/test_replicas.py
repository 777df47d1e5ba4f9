"""Replicas for real: three `reef serve` processes on loopback share one PostgreSQL store and one
release remote (a `file://` bare repository, with Git LFS). Traffic goes round robin with
sessions; one replica is killed under load and no acknowledged record is lost; a release
published from one place serves on every replica (how fast: bench/speed/replicas.py); the learner's
replica is killed and another replica's worker takes over."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from reef.testing.processes import (
    ServerProcess,
    free_port,
    reef_serve,
    run_reef,
    serving_everywhere,
)
from tests.conftest import TOKEN
from tests.support.scripted import ECHO_RECIPE

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# A release serves on every replica well before this; how fast (the 2 s) is measured by
# bench/speed/replicas.py, not here: a test holds behaviour, with room for a slow machine.
PROPAGATION_S = 20.0



def remote(folder: Path) -> str:
    bare = folder / "releases-remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True)
    return f"file://{bare}"


def replica_folder(folder: Path, name: str, learning: str = "") -> Path:
    """One replica's own project folder, as on its own machine: its own `.reef` (a copy of the
    release chain, checkouts), the shared store and remote from the environment."""
    project = folder / name
    project.mkdir()
    learning = learning or "  scenarios: []\n"
    (project / "reef.yaml").write_text(
        f"gate:\n  policy: always\nlearning:\n  interval_s: 0.2\n  lease_s: 2.0\n{learning}"
    )
    return project


def start_replicas(
    folders: list[Path], peer: ServerProcess, env: dict[str, str]
) -> list[ServerProcess]:
    proxy = ("--engine", "upstream", "--upstream-url", f"{peer.url}/v1")
    servers = [reef_serve(folder, free_port(), *proxy, env=env) for folder in folders]
    with ThreadPoolExecutor(len(servers)) as pool:
        return list(pool.map(lambda server: server.start(), servers))


def test_three_replicas_share_experience_and_releases_and_survive_a_kill(
    tmp_path: Path, peer: ServerProcess, postgres_url: str
) -> None:
    env = {"REEF_TOKEN": TOKEN, "REEF_STORE_URL": postgres_url}
    env["REEF_RELEASES_REMOTE"] = remote(tmp_path)
    folders = [replica_folder(tmp_path, f"replica-{n}") for n in range(3)]
    replicas = start_replicas(folders, peer, env)
    try:
        receipts = traffic_with_a_kill(replicas)
        survivors = [replicas[0], replicas[2]]
        for receipt, session, replica_url in receipts:  # every receipt, from any replica
            for replica in survivors:
                found = httpx.get(f"{replica.url}/reef/records/{receipt}", headers=HEADERS)
                assert found.status_code == 200, f"{receipt} (from {replica_url}) was lost"
                assert found.json()["session"] == session

        harness = tmp_path / "harness"
        harness.mkdir()
        (harness / "AGENTS.md").write_text("Answer in one short sentence.\n")
        published = run_reef(
            folders[0], "release", "publish", str(harness), "--kind", "harness", "--approve",
            env={**os.environ, **env},
        )  # fmt: skip
        assert published.returncode == 0, published.stdout + published.stderr
        took = seconds_until_all_serve(survivors, "default@1")
        assert took < PROPAGATION_S, f"default@1 did not serve on every replica ({took:.2f} s)"
        status = httpx.get(f"{survivors[1].url}/reef/status", headers=HEADERS).json()
        assert status["releases"]["remote"]["reachable"] is True
        assert status["store"]["dialect"] == "postgresql"
    finally:
        for replica in replicas:
            replica.stop()


def traffic_with_a_kill(replicas: list[ServerProcess]) -> list[tuple[str, str, str]]:
    """Round-robin calls with sessions from 6 clients; replica 1 is killed by SIGKILL once 30
    receipts are out. The receipts every client got: (receipt, session, replica)."""
    received: list[tuple[str, str, str]] = []
    lock, killed = threading.Lock(), threading.Event()
    turns = itertools.count()
    deadline = time.monotonic() + 90

    def client(number: int) -> None:
        session = f"agent-{number}"
        with httpx.Client(timeout=30, headers={**HEADERS, "x-reef-session": session}) as http:
            while len(received) < 80 and time.monotonic() < deadline:
                replica = replicas[next(turns) % len(replicas)]
                if killed.is_set() and replica is replicas[1]:
                    continue  # the load balancer took the dead replica out
                body = {"messages": [{"role": "user", "content": f"{session} asks"}]}
                try:
                    answer = http.post(f"{replica.url}/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    continue  # the killed replica: no receipt, nothing promised
                if answer.status_code == 200:
                    with lock:
                        received.append(
                            (answer.headers["x-reef-agent-record-id"], session, replica.url)
                        )
                        if len(received) == 30:
                            replicas[1].kill()
                            killed.set()

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(client, range(6)))
    assert killed.is_set() and len(received) >= 80, f"{len(received)} receipts"
    return received


def seconds_until_all_serve(replicas: list[ServerProcess], release_id: str) -> float:
    """Seconds until every replica serves `release_id` (over PROPAGATION_S: they did not)."""
    started = time.monotonic()
    if not serving_everywhere(replicas, release_id, TOKEN, timeout=PROPAGATION_S + 1):
        return PROPAGATION_S + 1
    return time.monotonic() - started




def test_one_learner_across_replicas_and_another_takes_over_when_its_replica_dies(
    tmp_path: Path, peer: ServerProcess, postgres_url: str
) -> None:
    """Both replicas run a learning worker; exactly one holds the scenario's lease and learns.
    Its replica and worker are killed with SIGKILL (nothing gives the lease up); the other
    replica's worker takes the lease once it expires and learns from the next record."""
    env = {"REEF_TOKEN": TOKEN, "REEF_STORE_URL": postgres_url}
    env["REEF_RELEASES_REMOTE"] = remote(tmp_path)
    folders = []
    for n in range(2):
        learning = f"  recipe: {tmp_path}/recipes.py:Echo\n  batch_size: 1\n"
        folders.append(replica_folder(tmp_path, f"replica-{n}", learning))
    (tmp_path / "recipes.py").write_text(ECHO_RECIPE)
    replicas = start_replicas(folders, peer, env)
    try:
        ask(replicas[0])
        seconds_until_all_serve(replicas, "default@1")
        learner = learner_pid(replicas[0])
        leading = next(r for r in replicas if parent_of(learner) == r.process.pid)  # type: ignore[union-attr]
        other = replicas[1 - replicas.index(leading)]
        leading.kill()
        subprocess.run(["kill", "-9", str(learner)], check=False)  # its worker too: no goodbye
        ask(other)
        took = seconds_until_all_serve([other], "default@2")
        assert took < PROPAGATION_S, f"nobody learned after the learner died ({took:.1f} s)"
        assert parent_of(learner_pid(other)) == other.process.pid  # type: ignore[union-attr]
    finally:
        for replica in replicas:
            replica.stop()


def ask(replica: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "Teach me something."}]}
    answer = httpx.post(f"{replica.url}/v1/chat/completions", json=body, headers=HEADERS)
    assert answer.status_code == 200, answer.text


def learner_pid(replica: ServerProcess) -> int:
    """The pid of the worker holding the default scenario's lease, as `/reef/status` names it."""
    status = httpx.get(f"{replica.url}/reef/status", headers=HEADERS).json()
    holder = status["learning"]["scenarios"]["default"]["learner"]
    return int(holder.split(":")[1])


def parent_of(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def test_a_replica_that_loses_the_remote_keeps_serving_and_says_so(
    tmp_path: Path, peer: ServerProcess
) -> None:
    """The remote goes away under a running replica (here: its bare repository moves): the
    replica keeps serving its last release, and `/reef/status` says the remote is unreachable;
    once it is back, the replica catches up."""
    bare_url = remote(tmp_path)
    bare = Path(bare_url.removeprefix("file://"))
    env = {"REEF_TOKEN": TOKEN, "REEF_RELEASES_REMOTE": bare_url}
    project = replica_folder(tmp_path, "replica")
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "AGENTS.md").write_text("Answer in one short sentence.\n")
    publish = ("release", "publish", str(harness), "--kind", "harness", "--approve")
    published = run_reef(project, *publish, env={**os.environ, **env})
    assert published.returncode == 0, published.stdout + published.stderr
    (replica,) = start_replicas([project], peer, env)
    try:
        assert seconds_until_all_serve([replica], "default@1") < PROPAGATION_S
        bare.rename(tmp_path / "away.git")
        status = status_once(replica, lambda remote: remote["reachable"] is False)
        assert status["releases"]["remote"]["reachable"] is False, status["releases"]
        assert "could not be reached" in status["releases"]["remote"]["error"]
        assert status["serving"]["default"] == "default@1"
        body = {"messages": [{"role": "user", "content": "still there?"}]}
        answer = httpx.post(f"{replica.url}/v1/chat/completions", json=body, headers=HEADERS)
        assert answer.status_code == 200 and answer.headers["x-reef-release-id"] == "default@1"
        (tmp_path / "away.git").rename(bare)
        status = status_once(replica, lambda remote: remote["reachable"] is True)
        assert status["releases"]["remote"]["reachable"] is True
    finally:
        replica.stop()


def status_once(replica: ServerProcess, holds: Callable[[dict], bool]) -> dict:
    """The replica's `/reef/status` once its release remote's state `holds` (or after
    PROPAGATION_S, as it is then)."""
    deadline = time.monotonic() + PROPAGATION_S
    while True:
        status = httpx.get(f"{replica.url}/reef/status", headers=HEADERS).json()
        if holds(status["releases"]["remote"]) or time.monotonic() > deadline:
            return status
        time.sleep(0.1)
