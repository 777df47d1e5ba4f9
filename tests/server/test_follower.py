"""A broken release head stops neither start-up nor the other scenarios' switches.

The broken head is real: a ref in the release repository pointing at a commit that holds no
release manifest, as a hand-edited or half-copied repository would.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from reef.releases.chain import ReleaseChain
from reef.testing.artifacts import harness
from reef.testing.in_process import reef_in_process
from reef.testing.processes import run_reef
from tests.conftest import write_config


def break_head(repository: Path, scenario: str) -> str:
    """Point `scenario`'s head at a commit of an empty tree: no manifest, nothing to serve."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repository, check=True, capture_output=True, text=True
        ).stdout.strip()

    empty_tree = git("hash-object", "-t", "tree", "/dev/null")
    commit = git("commit-tree", empty_tree, "-m", "not a release")
    git("update-ref", ReleaseChain.head_ref(scenario), commit)
    return commit


def serving(url: str) -> dict:
    return httpx.get(f"{url}/reef/status").json()


def test_a_broken_head_is_reported_and_the_others_still_switch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_config(tmp_path, "gate:\n  policy: always\n")
    publish = ("release", "publish", "--kind", "harness", "--approve")
    first = harness(tmp_path / "first", "You are brief.")
    assert run_reef(tmp_path, *publish, str(first), "--scenario", "good").returncode == 0
    break_head(tmp_path / ".reef/releases.git", "broken")

    caplog.set_level(logging.INFO)
    with reef_in_process(tmp_path) as server:
        status = serving(server.url)
        assert status["serving"]["good"] == "good@1"
        assert "broken" not in status["serving"]
        assert "cannot serve" in status["release_errors"]["broken"]

        second = harness(tmp_path / "second", "You are very brief.")
        assert run_reef(tmp_path, *publish, str(second), "--scenario", "good").returncode == 0
        deadline = time.monotonic() + 10
        while serving(server.url)["serving"]["good"] != "good@2":
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.2)
        time.sleep(1.5)  # several polls of the broken head
        status = serving(server.url)
        assert "broken" in status["release_errors"]
        reply = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"x-reef-scenario": "broken"},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.headers["x-reef-release-id"] == "base"
    logged = [r.getMessage() for r in caplog.records if "scenario broken:" in r.getMessage()]
    assert len(logged) == 1, logged  # once per change, not at every poll
