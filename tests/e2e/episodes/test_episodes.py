"""Whole episodes over real HTTP on loopback: a Reef server in front of a scripted model (whose
answers are known, so outcomes are certain), the native agent and the oracle in bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from reef.episodes.runner import Episode, EpisodeSettings, run_episode, run_paired
from reef.episodes.sandbox import Limits, SandboxUnavailable, require_sandbox
from reef.episodes.tasks import load_suite, load_task
from reef.episodes.tokens import EpisodeGrant, mint
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN
from tests.support.scripted_chat import answer, scripted_reef, tool_call

SUITE = Path(__file__).resolve().parents[3] / "evals" / "tasks"
# The held-out tasks of bench.learning.harness_episodes: the same kinds on other files and words.
HELD_OUT_SUITE = SUITE.parents[1] / "bench" / "learning" / "episode_tasks"
ADMIN_TOKEN = "admin-token-77c1"
UPSTREAM_KEY = "upstream-key-5d9e"
SECRETS = (TOKEN, ADMIN_TOKEN, UPSTREAM_KEY)
# The shell command the scripted model sends on the snooping task: it searches the sandbox for
# every secret, each written in two halves so the command itself holds none of them.
SNOOP = "; ".join(
    f'S="{secret[:5]}""{secret[5:]}"; grep -rslF "$S" /app /logs /home /tmp /etc /run /opt; '
    f'cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n" | grep -cF "$S"'
    for secret in SECRETS
)


async def scripted(request: Request) -> Response:
    """One tool call for the task the instruction names, then a final answer."""
    messages = (await request.json())["messages"]
    if any(message["role"] == "tool" for message in messages):
        return answer({"role": "assistant", "content": "done"})
    instruction = messages[-1]["content"]
    if "coral" in instruction:
        return answer(tool_call("write_file", {"path": "answer.txt", "content": "coral\n"}))
    if "SNOOP" in instruction:
        return answer(tool_call("shell", {"command": SNOOP}))
    return answer({"role": "assistant", "content": "I cannot do that."})


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"REEF_TOKEN": TOKEN, "REEF_ADMIN_TOKEN": ADMIN_TOKEN}
    project = tmp_path_factory.mktemp("project")
    with scripted_reef(project, scripted, env, upstream_key=UPSTREAM_KEY) as server:
        yield server


def settings(tmp_path: Path) -> EpisodeSettings:
    return EpisodeSettings(limits=Limits(wall_time_s=60), work_root=tmp_path, max_steps=4)


def episode(reef: ServerProcess, tmp_path: Path, task: Path, agent: str = "native") -> Episode:
    return run_episode(
        load_task(task), agent, reef.url, tree="base", token=TOKEN, settings=settings(tmp_path)
    )


def test_the_native_agent_solves_a_task_and_its_calls_are_experience(
    reef: ServerProcess, tmp_path: Path
) -> None:
    done = episode(reef, tmp_path, SUITE / "write-word")
    assert done.passed, (done.agent_run, done.test_output)
    assert [step["tool"] for step in done.commands if "tool" in step] == ["write_file"]
    assert len(done.calls) == 2
    assert {call["session"] for call in done.calls} == {done.id}
    tagged = httpx.get(
        f"{reef.url}/reef/records",
        params={"tag": [f"episode:{done.id}", "task:write-word", "tree:base"]},
        headers={"authorization": f"Bearer {TOKEN}"},
    ).json()["data"]
    assert [record["id"] for record in tagged] == [call["id"] for call in done.calls]
    assert done.report_id is not None
    with ExperienceStore(reef.cwd / ".reef" / "experience.db") as store:
        view = ExperienceView(store, "default", consumed=set())
    (trajectory,) = [t for t in view.trajectories if set(t.record_ids) & {done.calls[0]["id"]}]
    assert trajectory.record_ids == [call["id"] for call in done.calls]
    assert trajectory.turns[-1].score == 1.0
    report = trajectory.turns[-1].reports[0]
    assert (
        report["feedback"]["task"] == "write-word" and "PASS" in report["feedback"]["test_output"]
    )


def test_no_reef_token_or_upstream_key_is_anywhere_inside(
    reef: ServerProcess, tmp_path: Path
) -> None:
    task = Path(shutil.copytree(SUITE / "write-word", tmp_path / "snoop"))
    (task / "instruction.md").write_text("SNOOP around.\n")
    done = episode(reef, tmp_path, task)
    (search,) = [step for step in done.commands if step.get("tool") == "shell"]
    assert search["result"]["output"].split() == ["0", "0", "0"]  # no file, no environment
    for path in done.workspace.rglob("*"):  # type: ignore[union-attr]
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(secret in text for secret in SECRETS), path
    assert not any(secret in done.agent_run.output for secret in SECRETS)  # type: ignore[union-attr]


def test_an_episode_token_serves_its_scenario_s_inference_and_nothing_else(
    reef: ServerProcess,
) -> None:
    grant = EpisodeGrant("default", "ep-scope-1", "t", "base", time.time() + 60)
    token = mint(grant, TOKEN)
    headers = {"authorization": f"Bearer {token}"}
    chat = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    served = httpx.post(f"{reef.url}/v1/chat/completions", json=chat, headers=headers)
    assert served.status_code == 200, served.text
    record = served.headers["x-reef-agent-record-id"]
    stored = httpx.get(
        f"{reef.url}/reef/records/{record}", headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert stored.json()["session"] == "ep-scope-1"

    refused = httpx.get(f"{reef.url}/reef/records", headers=headers)
    assert refused.status_code == 403 and "inference only" in refused.json()["error"]["message"]
    other = httpx.post(
        f"{reef.url}/v1/chat/completions", json=chat, headers={**headers, "x-reef-scenario": "x"}
    )
    assert other.status_code == 403 and "serves scenario 'default'" in other.text
    expired = mint(EpisodeGrant("default", "ep-old", "t", "base", time.time() - 1), TOKEN)
    late = httpx.post(
        f"{reef.url}/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {expired}"}
    )
    assert late.status_code == 401 and "expired" in late.text
    forged = mint(grant, "not-a-token-of-this-server")
    assert (
        httpx.post(
            f"{reef.url}/v1/chat/completions",
            json=chat,
            headers={"authorization": f"Bearer {forged}"},
        ).status_code
        == 401
    )


@pytest.mark.parametrize("suite", [SUITE, HELD_OUT_SUITE], ids=["shipped", "bench-held-out"])
def test_the_oracle_passes_each_suite_from_the_command_line(
    reef: ServerProcess, tmp_path: Path, suite: Path
) -> None:
    env = {**os.environ, "REEF_TOKEN": TOKEN, "REEF_URL": reef.url, "TMPDIR": str(tmp_path)}
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "reef", "tasks", "run", str(suite), "--agent", "oracle", "--json"],
        cwd=reef.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    episodes = json.loads(done.stdout)
    assert [e["task"] for e in episodes if e["passed"]] == [t.name for t in load_suite(suite)]
    assert len(episodes) == 4


def test_paired_episodes_run_interleaved_on_the_same_seed(
    reef: ServerProcess, tmp_path: Path
) -> None:
    tasks = load_suite(SUITE)[:2]
    ran: list[Episode] = []
    pairs = run_paired(
        tasks,
        "oracle",
        reef.url,
        {"current": "default", "candidate": "default"},
        repeats=2,
        on_episode=ran.append,
        token=TOKEN,
        settings=settings(tmp_path),
    )
    assert [(e.task, e.tree, e.seed) for e in ran] == [
        ("add-numbers", "current", 0),
        ("add-numbers", "candidate", 0),
        ("count-lines", "current", 0),
        ("count-lines", "candidate", 0),
        ("add-numbers", "candidate", 1),
        ("add-numbers", "current", 1),
        ("count-lines", "candidate", 1),
        ("count-lines", "current", 1),
    ]
    assert all(a.task == b.task and a.seed == b.seed and a.passed and b.passed for a, b in pairs)


def test_without_bubblewrap_episodes_are_refused_unless_sandbox_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "reef.episodes.sandbox.bwrap_problem", lambda: "bubblewrap is not installed"
    )
    with pytest.raises(SandboxUnavailable, match=r"episodes\.sandbox: none"):
        require_sandbox("bwrap")
    require_sandbox("none")
