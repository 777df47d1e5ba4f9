"""One model per machine: Reef's own processes use the running server's engine.

The server advertises itself in `.reef/server.json` with an internal token; the internal route
runs requests on its engine without recording them. `reef release publish` uses it when a server
runs (here its config names a model file that does not exist, so loading one itself would fail).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.inference.server_file import find_running_server
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, write_config

TASKS = [
    {
        "messages": [{"role": "user", "content": q}],
        "scorer": {"type": "regex", "pattern": "^\\W*\\w+\\W*$"},
    }
    for q in ("Describe the sea.", "Describe a forest.")
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ServerProcess]]:
    folder = tmp_path_factory.mktemp("one-engine")
    write_config(folder, SMALL_ENGINE + "gate:\n  max_tokens: 24\n")
    (folder / "evals").mkdir()
    (folder / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    with reef_serve(folder, free_port()).start() as server:
        yield folder, server


def internal(server: ServerProcess, token: str | None, body: dict) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(
        f"{server.url}/reef/internal/complete", json=body, headers=headers, timeout=60
    )


def records(server: ServerProcess) -> int:
    scenarios = httpx.get(f"{server.url}/reef/status").json()["store"]["scenarios"]
    return sum(s["records"] for s in scenarios.values())


def test_the_server_advertises_itself_to_its_state_folder(
    project: tuple[Path, ServerProcess],
) -> None:
    folder, server = project
    found = find_running_server(folder / ".reef")
    assert found is not None and found.url == server.url
    assert server.process is not None and found.pid == server.process.pid


def test_internal_route_needs_the_internal_token_even_without_tokens(
    project: tuple[Path, ServerProcess],
) -> None:
    folder, server = project
    body = {"request": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}}
    for token in (None, "guess"):
        refused = internal(server, token, body)
        assert refused.status_code == 403
        assert "internal token" in refused.json()["error"]["message"]
    token = json.loads((folder / ".reef/server.json").read_text())["token"]
    before = records(server)
    answered = internal(server, token, body)
    assert answered.status_code == 200, answered.text
    data = answered.json()
    assert data["response"]["choices"][0]["message"]["content"] is not None
    assert len(data["token_ids"]) == len(data["token_logprobs"]) >= 1
    assert records(server) == before  # Reef's own calls are not traffic


def test_internal_route_loads_adapters_from_the_state_folder_only(
    project: tuple[Path, ServerProcess], tmp_path: Path
) -> None:
    folder, server = project
    token = json.loads((folder / ".reef/server.json").read_text())["token"]
    body = {
        "request": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        "adapter": str(tmp_path),
    }
    refused = internal(server, token, body)
    assert refused.status_code == 400
    assert "outside the state folder" in refused.json()["error"]["message"]


def test_publish_evaluates_on_the_running_server(
    project: tuple[Path, ServerProcess], tmp_path: Path
) -> None:
    folder, server = project
    # A config for the same state folder whose engine could not load here: only the server's
    # engine can evaluate.
    config = tmp_path / "reef.yaml"
    config.write_text(
        f"state_dir: {folder / '.reef'}\nevals_dir: {folder / 'evals'}\n"
        "engine:\n  llamacpp:\n    model: /nonexistent/model.gguf\n"
        "gate:\n  max_tokens: 24\n"
    )
    candidate = harness(tmp_path / "brief", "Answer in three words at most.", {"max_tokens": 6})
    before = records(server)
    result = run_reef(
        tmp_path,
        "release",
        "publish",
        str(candidate),
        "--kind",
        "harness",
        "-c",
        str(config),
        "--json",
    )
    assert result.returncode in (0, 1), result.stderr
    decided = json.loads(result.stdout)
    assert decided["state"] in ("released", "rejected")
    assert decided["evaluation"]["tasks"] == len(TASKS), decided
    assert records(server) == before


def test_publish_without_a_server_loads_the_engine_itself(tmp_path: Path) -> None:
    write_config(tmp_path, SMALL_ENGINE + "gate:\n  max_tokens: 8\n")
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(json.dumps(TASKS[0]) + "\n")
    candidate = harness(tmp_path / "brief", "Answer in three words at most.", {"max_tokens": 6})
    result = run_reef(tmp_path, "release", "publish", str(candidate), "--kind", "harness", "--json")
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["evaluation"]["tasks"] == 1


def test_a_stale_server_file_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / ".reef"
    state.mkdir()
    (state / "server.json").write_text(
        json.dumps({"url": f"http://127.0.0.1:{free_port()}", "token": "x", "pid": 999_999_999})
    )
    assert find_running_server(state) is None
