"""`POST /reef/harness/proposals` over real HTTP: an agent's change to its tree, admitted against
the head with the rules every change meets (a candidate for the gate) or refused with the rule;
in Reef's mutation shape and in upstream Reef's entry shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reef.config import load_config
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import TOKEN

HEADERS = {"authorization": f"Bearer {TOKEN}", "x-reef-scenario": "default"}


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    project = tmp_path_factory.mktemp("project")
    (project / "reef.yaml").write_text(
        "engine:\n  kind: upstream\n  upstream:\n    url: http://127.0.0.1:9/v1\n"
    )
    with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        config = load_config(project / "reef.yaml", env={"REEF_TOKEN": TOKEN})
        with ExperienceStore(config.experience_db) as store:
            workflow = ReleaseWorkflow(config, store)
            candidate = workflow.propose("default", "harness", {"AGENTS.md": b"Be helpful.\n"})
            workflow.approve(candidate.id, force=True)
        yield server


def propose(reef: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{reef.url}/reef/harness/proposals", json=body, headers=HEADERS)


def candidate(reef: ServerProcess, candidate_id: str) -> dict[str, Any]:
    config = load_config(reef.cwd / "reef.yaml", env={"REEF_TOKEN": TOKEN})
    with ExperienceStore(config.experience_db) as store:
        found = ReleaseWorkflow(config, store).candidates.get(candidate_id)
        folder = reef.cwd / found.folder  # relative to the server's folder, or absolute
        files = {
            p.relative_to(folder).as_posix(): p.read_text()
            for p in folder.rglob("*")
            if p.is_file()
        }
        return {
            "state": found.state,
            "source": found.source,
            "reason": found.reason,
            "files": files,
        }


def test_an_admitted_proposal_is_a_candidate_of_the_head_s_tree_with_the_change(
    reef: ServerProcess,
) -> None:
    answer = propose(
        reef,
        {
            "mutations": [{"op": "create", "path": "rules/tests.md", "content": "Run the tests."}],
            "reason": "three sessions answered before the tests ran",
            "session": "s-1",
            "release_id": "default@1",
        },
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["admitted"] is True and body["reason"] is None
    assert body["release_id"] == "default@1"
    stored = candidate(reef, body["proposal_id"])
    assert stored["state"] == "proposed" and stored["source"] == "agent"
    assert stored["files"] == {"AGENTS.md": "Be helpful.\n", "rules/tests.md": "Run the tests."}
    assert "session s-1" in stored["reason"] and "before the tests ran" in stored["reason"]


def test_upstream_s_entry_shape_is_a_rule_or_a_skill_of_this_tree(reef: ServerProcess) -> None:
    entry = {
        "op": "create",
        "id": "check",
        "options": {"name": "skills", "config": {"text": "Check."}},
    }
    body = propose(
        reef, {"mutations": [entry], "reason": "r", "session": "s", "release_id": "x"}
    ).json()
    assert body["admitted"] is True
    assert candidate(reef, body["proposal_id"])["files"]["skills/check/SKILL.md"] == "Check."


@pytest.mark.parametrize(
    ("mutation", "rule"),
    [
        ({"op": "create", "path": "AGENTS.md", "content": "x"}, "already exists: use update"),
        ({"op": "update", "path": "rules/none.md", "content": "x"}, "does not exist: use create"),
        ({"op": "create", "path": "../etc/passwd", "content": "x"}, "outside the harness tree"),
        ({"op": "update", "path": "AGENTS.md", "content": "Be helpful.\n"}, "changes nothing"),
        ({"op": "create", "id": "t", "options": {"name": "hooks"}}, "entry kind 'hooks' is not"),
        ({"op": "rename", "path": "AGENTS.md"}, "op must be one of"),
    ],
)
def test_a_change_that_breaks_a_rule_is_refused_naming_it_and_stores_nothing(
    reef: ServerProcess, mutation: dict[str, Any], rule: str
) -> None:
    config = load_config(reef.cwd / "reef.yaml", env={"REEF_TOKEN": TOKEN})
    with ExperienceStore(config.experience_db) as store:
        before = len(ReleaseWorkflow(config, store).candidates.list("default"))
    body = propose(reef, {"mutations": [mutation], "reason": "r"}).json()
    assert body["admitted"] is False and rule in body["reason"]
    assert body["proposal_id"] is None and body["release_id"] == "default@1"
    with ExperienceStore(config.experience_db) as store:
        assert len(ReleaseWorkflow(config, store).candidates.list("default")) == before


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"mutations": []}, "non-empty list"),
        ({"mutations": [{"op": "create"}], "session": 3}, "must be strings"),
        ({"mutations": [{"op": "create"}], "extra": 1}, "unknown key(s) extra"),
    ],
)
def test_a_malformed_proposal_is_a_400_that_says_what_to_send(
    reef: ServerProcess, body: dict[str, Any], says: str
) -> None:
    answer = propose(reef, body)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"]
