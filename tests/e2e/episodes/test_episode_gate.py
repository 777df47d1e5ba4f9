"""The episode gate over real HTTP: `reef serve` in front of a scripted model whose answers
depend on the harness it is served under, the native agent in bubblewrap, and the real
release workflow judging candidates by what the agent did on a Harbor task."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from reef.config import load_config
from reef.episodes.gate import task_results
from reef.episodes.runner import Episode
from reef.episodes.tasks import load_suite
from reef.episodes.tokens import EpisodeGrant, candidate_tree, mint
from reef.inference.server_file import find_advertised
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess, free_port, reef_serve, serving_everywhere
from reef.testing.threaded import chat_upstream
from tests.conftest import TOKEN
from tests.e2e.episodes.test_episodes import SUITE, answer, tool_call

HELPS = "Write files with the write_file tool, then stop."
BREAKS = "Never call a tool: describe the change in prose instead."


async def harness_aware(request: Request) -> Response:
    """Writes the file with the tool only under a harness that says so, never under one that
    forbids tools; under any other tree it gives up."""
    messages = (await request.json())["messages"]
    system = " ".join(str(m["content"]) for m in messages if m["role"] == "system")
    if any(message["role"] == "tool" for message in messages):
        return answer({"role": "assistant", "content": "done"})
    if HELPS in system and BREAKS not in system:
        return answer(tool_call("write_file", {"path": "answer.txt", "content": "coral\n"}))
    return answer({"role": "assistant", "content": "I cannot do that."})


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ServerProcess]]:
    folder = tmp_path_factory.mktemp("project")
    shutil.copytree(SUITE / "write-word", folder / "tasks" / "write-word")
    with chat_upstream(harness_aware, "scripted") as upstream:
        (folder / "reef.yaml").write_text(
            f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
            "gate:\n  policy: no_regression\n"
            "  episodes:\n    tasks: tasks\n    agent: native\n    repeats: 2\n"
            "episodes:\n  wall_time_s: 60\n  max_steps: 4\n"
        )
        with reef_serve(folder, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
            yield folder, server


def gate(folder: Path, rule: str) -> Any:
    config = load_config(folder / "reef.yaml", env={"REEF_TOKEN": TOKEN})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        candidate = workflow.propose("default", "harness", {"rules/tools.md": rule.encode()})

        async def unused(*_: Any) -> str:
            raise AssertionError("an episode gate with no chat tasks asks no chat answer")

        return asyncio.run(workflow.gate(candidate, unused))


def test_the_episode_gate_releases_what_helps_the_agent_and_refuses_what_breaks_it(
    project: tuple[Path, ServerProcess],
) -> None:
    folder, server = project
    helped = gate(folder, HELPS)
    assert helped.state == "released", helped.decision
    (result,) = helped.evaluation["results"]
    assert result["task_id"] == "episode:write-word" and result["group"] == "files"
    assert (result["current_score"], result["candidate_score"]) == (0.0, 1.0)
    assert "write_file" in result["candidate_answer"]  # what each tree did, for a reviewer
    assert "test: PASS: answer.txt holds coral" in result["candidate_answer"]
    assert "2 call(s)" in result["candidate_answer"]
    assert "FAIL: answer.txt does not hold coral" in result["current_answer"]
    assert serving_everywhere([server], helped.release_id, TOKEN)

    broken = gate(folder, BREAKS)
    assert broken.state == "rejected" and not broken.unjudged
    assert "write-word" in (broken.decision or "")
    (result,) = broken.evaluation["results"]
    assert (result["current_score"], result["candidate_score"]) == (1.0, 0.0)

    records = httpx.get(
        f"{server.url}/reef/records",
        params={"tag": f"tree:{candidate_tree(broken.id)}", "limit": 50},
        headers={"authorization": f"Bearer {TOKEN}"},
    ).json()["data"]
    assert len(records) == 2  # one call per episode, each in its own session
    assert len({record["session"] for record in records}) == 2


def test_only_a_signed_grant_serves_a_candidate_and_only_while_it_is_judged(
    project: tuple[Path, ServerProcess],
) -> None:
    folder, server = project
    config = load_config(folder / "reef.yaml", env={"REEF_TOKEN": TOKEN})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        candidate = workflow.propose("default", "harness", {"rules/x.md": HELPS.encode()})
        rejected = workflow.reject(candidate.id, "not this one")
    body = {"messages": [{"role": "user", "content": "write coral"}]}
    chat = f"{server.url}/v1/chat/completions"

    # A client that names the tree itself is served by what the scenario serves.
    sent = {"authorization": f"Bearer {TOKEN}", "x-reef-episode-tree": candidate_tree("c1")}
    assert httpx.post(chat, json=body, headers=sent).status_code == 200

    internal = find_advertised(config.state_dir)
    assert internal is not None
    grant = EpisodeGrant(
        "default", "ep-x", "write-word", candidate_tree(rejected.id), time.time() + 60
    )
    refused = httpx.post(
        chat, json=body, headers={"authorization": f"Bearer {mint(grant, internal.token)}"}
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "episode_candidate"
    assert "rejected" in refused.json()["error"]["message"]


def episode(task: str, tree: str, reward: float | None, repeat: int) -> Episode:
    return Episode(
        f"ep-{task}-{tree}-{repeat}", task, task, "native", tree, "default", repeat, reward
    )


def test_each_task_scores_its_mean_reward_on_each_side_unscored_counting_zero() -> None:
    tasks = load_suite(SUITE)
    pairs = [
        (episode("add-numbers", "current", 1.0, 0), episode("add-numbers", "c", 0.0, 0)),
        (episode("add-numbers", "current", 1.0, 1), episode("add-numbers", "c", 1.0, 1)),
        (episode("fix-typo", "current", None, 0), episode("fix-typo", "c", 2.0, 0)),
    ]
    results = {r.task_id: r for r in task_results(tasks, pairs)}
    assert set(results) == {"episode:add-numbers", "episode:fix-typo"}
    assert (
        results["episode:add-numbers"].current_score,
        results["episode:add-numbers"].candidate_score,
    ) == (1.0, 0.5)
    assert (
        results["episode:fix-typo"].current_score,
        results["episode:fix-typo"].candidate_score,
    ) == (0.0, 1.0)
    assert results["episode:fix-typo"].task_hash != results["episode:add-numbers"].task_hash
    assert json.dumps([r.prompt for r in results.values()])  # the instructions, for a reviewer
