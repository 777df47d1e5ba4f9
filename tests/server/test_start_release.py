"""`x-reef-release-id` on inference over real HTTP (upstream Reef's request header): a new
scenario starts serving a copy of the named release and answers from it at once; an existing
scenario must be named with the release it started from, or the call is a 409 naming both.
Starting a scenario on a release makes it serve: the admin token may, the inference token may
not (issue 73)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from reef.config import load_config
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import TOKEN

ADMIN = "test-admin-7d2b"


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory, peer: ServerProcess) -> Iterator[ServerProcess]:
    project = tmp_path_factory.mktemp("project")
    (project / "reef.yaml").write_text(
        f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n"
    )
    tokens = {"REEF_TOKEN": TOKEN, "REEF_ADMIN_TOKEN": ADMIN}
    with reef_serve(project, free_port(), env=tokens).start() as server:
        config = load_config(project / "reef.yaml", env=tokens)
        with ExperienceStore(config.experience_db) as store:
            workflow = ReleaseWorkflow(config, store)
            candidate = workflow.propose("default", "harness", {"AGENTS.md": b"Be brief.\n"})
            workflow.approve(candidate.id, force=True)  # default@1
        yield server


def call(
    reef: ServerProcess, scenario: str, start: str | None, token: str = ADMIN
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "x-reef-scenario": scenario}
    if start is not None:
        headers["x-reef-release-id"] = start
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    return httpx.post(f"{reef.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_a_new_scenario_starts_from_the_named_release_and_serves_it_at_once(
    reef: ServerProcess,
) -> None:
    first = call(reef, "fresh", "default@1")
    assert first.status_code == 200, first.text
    assert first.headers["x-reef-release-id"] == "fresh@1"  # a copy, its first release
    again = call(reef, "fresh", "default@1")
    assert again.status_code == 200 and again.headers["x-reef-release-id"] == "fresh@1"
    assert call(reef, "fresh", None).headers["x-reef-release-id"] == "fresh@1"


def test_an_existing_scenario_named_with_another_start_is_a_409_naming_both(
    reef: ServerProcess,
) -> None:
    assert call(reef, "bound", "default@1").status_code == 200
    refused = call(reef, "bound", "base")
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "started from default@1" in message and "names base" in message
    # `default` started from the model alone: base is its start, default@1 is not.
    assert call(reef, "default", "base").status_code == 200
    assert call(reef, "default", "default@1").status_code == 409


def test_an_unknown_release_is_a_404_and_creates_nothing(reef: ServerProcess) -> None:
    missing = call(reef, "never", "default@9")
    assert missing.status_code == 404 and "default@9" in missing.json()["error"]["message"]
    assert call(reef, "never", None).headers["x-reef-release-id"] == "base"


def test_the_inference_token_cannot_start_a_scenario_on_a_release(reef: ServerProcess) -> None:
    refused = call(reef, "kiosk", "default@1", token=TOKEN)
    assert refused.status_code == 403
    assert "REEF_ADMIN_TOKEN" in refused.json()["error"]["message"]
    # Nothing was created: the scenario starts from the model alone, as any new one does.
    assert call(reef, "kiosk", None, token=TOKEN).headers["x-reef-release-id"] == "base"
    assert call(reef, "kiosk", "base", token=TOKEN).status_code == 200
    # The route says the same: POST /reef/scenarios with a release takes the admin token.
    headers = {"authorization": f"Bearer {TOKEN}"}
    body = {"name": "kiosk2", "release_id": "default@1"}
    created = httpx.post(f"{reef.url}/reef/scenarios", json=body, headers=headers, timeout=30)
    assert created.status_code == 403, created.text
    plain = httpx.post(
        f"{reef.url}/reef/scenarios", json={"name": "kiosk3"}, headers=headers, timeout=30
    )
    assert plain.status_code == 201, plain.text  # a scenario on the model alone: any token
    listed = httpx.get(f"{reef.url}/reef/scenarios/kiosk2/releases", headers=headers).json()
    assert listed["data"] == []
