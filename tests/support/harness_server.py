"""A project serving a harness release, its server, and the install scripts that server hands
out: what the pi test (test_harness_install) and the other agents' (test_agent_adapters) share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import TOKEN

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def publish(folder: Path, project: Path) -> None:
    result = run_reef(project, "release", "publish", str(folder), "--kind", "harness", "--approve")
    assert result.returncode == 0, result.stderr


def harness_project(folder: Path, config: str, prompt: str, settings: dict[str, Any]) -> Path:
    """`folder` with `config` as its reef.yaml, serving a harness of `prompt` and `settings` with
    one skill."""
    (folder / "reef.yaml").write_text(config)
    tree = harness(folder / "h1", prompt, settings)
    (tree / "skills/search").mkdir(parents=True)
    (tree / "skills/search/SKILL.md").write_text(
        "---\ndescription: search the code\n---\nUse grep.\n"
    )
    publish(tree, folder)
    return folder


@contextmanager
def serving(project: Path) -> Iterator[ServerProcess]:
    with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as running:
        yield running


def install_script(server: ServerProcess, adapter: str) -> str:
    response = httpx.get(
        f"{server.url}/reef/harness/install", params={"adapter": adapter}, headers=HEADERS
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/x-shellscript")
    return response.text
