"""Episode tests run real bubblewrap: skipped where it is missing or cannot run, but failed in
CI when it is missing (.ci/run installs it), where a skipped sandbox test would pass for nothing.
A machine whose kernel refuses bubblewrap's namespaces skips them, saying why, even in CI."""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response

from reef.episodes.sandbox import bwrap_problem
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream


@pytest.fixture(scope="session", autouse=True)
def require_bwrap() -> None:
    if os.environ.get("CI") and shutil.which("bwrap") is None:
        pytest.fail("CI must run the episode tests: .ci/run installs bubblewrap")
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(problem)


@contextmanager
def scripted_reef(
    project: Path,
    script: Callable[[Request], Awaitable[Response]],
    env: dict[str, str],
    upstream_key: str | None = None,
) -> Iterator[ServerProcess]:
    """`reef serve` in `project`, in front of a scripted model whose chat answers `script`
    gives (so an episode's outcome is certain)."""
    with chat_upstream(script, "scripted") as upstream:
        key = f"    api_key: {upstream_key}\n" if upstream_key else ""
        (project / "reef.yaml").write_text(
            f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n{key}"
        )
        with reef_serve(project, free_port(), env=env).start() as server:
            yield server
