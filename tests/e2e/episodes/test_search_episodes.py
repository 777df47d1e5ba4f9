"""Search recipes scored on episodes: a tree a recipe tries is served to the agent in the
sandbox (`trial:<digest>`, written under the state folder), and what the agent does under it is
its score. Against the running `reef serve` in front of a scripted model whose answers are known:
the agent writes the word only when the tree's rule tells it to, and the proposer (scripted
here too) writes that rule."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from reef.episodes.tokens import EpisodeGrant, mint, trial_tree
from reef.inference.server_file import find_running_server
from reef.learning.worker import MetricCalls
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream
from tests.conftest import TOKEN
from tests.e2e.episodes.test_episodes import SUITE, answer, tool_call
from tests.e2e.episodes.test_proactive_episodes import learner_of

RULE = "WRITE-CORAL: when asked to write a word, write it with write_file."


async def scripted(request: Request) -> Response:
    """The agent acts only when its tree holds the rule."""
    messages = (await request.json())["messages"]
    said = " ".join(str(message.get("content") or "") for message in messages)
    if any(message["role"] == "tool" for message in messages):
        return answer({"role": "assistant", "content": "done"})
    if "WRITE-CORAL" in said:
        return answer(tool_call("write_file", {"path": "answer.txt", "content": "coral\n"}))
    return answer({"role": "assistant", "content": "I cannot do that."})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ServerProcess]]:
    project = tmp_path_factory.mktemp("project")
    with chat_upstream(scripted, "scripted") as upstream:
        (project / "reef.yaml").write_text(
            f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n"
            "learning:\n  recipe: gepa\n  components: [system_prompt]\n  pareto_size: 1\n"
            "  minibatch_size: 1\n  max_metric_calls: 4\n"
            f"  episodes:\n    tasks: {SUITE / 'write-word'}\n"
            "episodes:\n  wall_time_s: 60\n  max_steps: 4\n"
        )
        with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
            yield project, server


def test_gepa_scores_its_trees_by_the_agent_s_episodes(
    served: tuple[Path, ServerProcess],
) -> None:
    project, _ = served
    learner = learner_of(project, "gepa")
    recipe = learner.lanes["default"].learners[0].recipe
    context = learner._context("default", recipe, None)
    context.ask = lambda messages, json_schema=None, max_tokens=400: json.dumps({"text": RULE})
    calls = MetricCalls()
    calls.count_in(context)
    records_before = len(learner.store.list_records("default", limit=1000))

    proposal = recipe.propose([], context)

    assert proposal is not None and RULE in proposal.files["AGENTS.md"].decode()
    # The seed tree's episode failed and the child's passed: scored by what the agent did.
    assert proposal.metrics["pareto_mean"] == [0.0, 1.0]
    # Seed, parent's minibatch, child's minibatch, child on the Pareto task: one episode each.
    assert proposal.metrics["metric_calls"] == calls.calls == 4
    assert proposal.eval_tasks == []  # the scenario's gate judges: no chat task of the search's
    # A tree the search tries is not experience: its episodes' calls were not recorded.
    assert len(learner.store.list_records("default", limit=1000)) == records_before
    learner.store.close()


@pytest.mark.parametrize("digest", ["0123456789abcdef", "../../../../etc"])
def test_an_episode_under_a_trial_tree_never_written_is_refused(
    served: tuple[Path, ServerProcess], digest: str
) -> None:
    project, server = served
    running = find_running_server(project / ".reef")
    assert running is not None
    grant = EpisodeGrant("default", "ep-trial", "write-word", trial_tree(digest), time.time() + 60)
    token = mint(grant, running.token)
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "episode_trial" and "trial tree" in error["message"]
