"""Harness adapters and their install scripts, run for real in a temporary HOME.

The pi test runs the real pi coding agent (npm @mariozechner/pi-coding-agent, installed by the
script when missing; .ci/run installs it beforehand) against Reef serving the embedded model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.harness.installers import unused_delimiter
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN
from tests.support.harness_server import (
    HEADERS,
    harness_project,
    install_script,
    publish,
    serving,
)


def pi_project(folder: Path) -> Path:
    # pi asks for thousands of tokens for its session title: cap them, or the test runs minutes.
    # Greedy, so pi's answer is the same in every run on a machine (pi sends no temperature).
    return harness_project(
        folder,
        "engine:\n  llamacpp: {n_ctx: 8192, n_threads: 2, max_tokens_cap: 48}\n",
        "You are a coding agent. Answer briefly.",
        {"max_tokens": 24, "temperature": 0, "seed": 0},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Serving default@1 to every test of the module but the one that publishes default@2."""
    with serving(pi_project(tmp_path_factory.mktemp("harness-project"))) as running:
        yield running


def run_script(text: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh"],
        input=text,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HOME": str(home), "REEF_TOKEN": TOKEN, **env},
    )


@pytest.mark.parametrize("adapter", ["pi", "openai-env"])
def test_install_scripts_are_valid_sh_and_hold_no_token(
    server: ServerProcess, adapter: str
) -> None:
    text = install_script(server, adapter)
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert TOKEN not in text
    assert server.url in text and "default@1" in text


def test_adapters_are_listed_and_unknown_ones_are_404(server: ServerProcess) -> None:
    listed = httpx.get(f"{server.url}/reef/harness/adapters", headers=HEADERS).json()["data"]
    assert {a["name"] for a in listed} == {"pi", "openai-env", "codex", "claude", "opencode"}
    for name in ("vim", "../pi", "pi/../../etc", "PI"):
        response = httpx.get(
            f"{server.url}/reef/harness/install", params={"adapter": name}, headers=HEADERS
        )
        assert response.status_code == 404
        assert "openai-env" in response.json()["error"]["message"]


def test_a_hostile_host_header_cannot_reach_the_script(server: ServerProcess) -> None:
    for host in ("evil$(id)", "x';rm -rf ~;'", "a`b`"):
        response = httpx.get(
            f"{server.url}/reef/harness/install",
            params={"adapter": "pi"},
            headers={**HEADERS, "host": host},
        )
        # Refused, or a script with the server's own address: never with the header's text.
        if response.status_code == 200:
            assert host not in response.text and f"REEF_URL='{server.url}'" in response.text
        else:
            assert response.status_code == 400


def test_current_harness_is_served(server: ServerProcess) -> None:
    current = httpx.get(f"{server.url}/reef/harness", headers=HEADERS).json()
    assert current["release_id"] == "default@1"
    assert current["files"]["skills/search/SKILL.md"].startswith("---")
    assert "- search: search the code" in current["system_prompt"]


def test_openai_env_installs_an_environment_file(server: ServerProcess, tmp_path: Path) -> None:
    result = run_script(install_script(server, "openai-env"), tmp_path)
    assert result.returncode == 0, result.stderr
    env_file = tmp_path / ".reef/harness/openai-env/default/env"
    sourced = subprocess.run(
        ["sh", "-c", f". {env_file} && echo $OPENAI_BASE_URL $OPENAI_API_KEY"],
        capture_output=True,
        text=True,
        env={**os.environ, "REEF_TOKEN": TOKEN},
    )
    assert sourced.stdout.split() == [f"{server.url}/v1", TOKEN]
    assert TOKEN not in env_file.read_text()
    prompt = (tmp_path / ".reef/harness/openai-env/default/system_prompt.md").read_text()
    assert prompt.startswith("You are a coding agent.")


@pytest.mark.skipif(
    shutil.which("pi") is None and shutil.which("npm") is None,
    reason="needs pi or npm (CI installs pi)",
)
@pytest.mark.e2e
def test_real_pi_through_reef(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "home").mkdir()
    project = pi_project(tmp_path / "project")
    with serving(project) as server:
        through_reef(server, project, tmp_path / "home")


def through_reef(server: ServerProcess, project: Path, home: Path) -> None:
    """pi installed by its script, asked, reported on, then told of a newer harness."""
    result = run_script(install_script(server, "pi"), home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (home / ".pi/agent/skills/search/SKILL.md").exists()
    bin_dir = home / ".local/bin"
    env = {
        **os.environ,
        "HOME": str(home),
        "REEF_TOKEN": TOKEN,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }

    def reef_pi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["reef-pi", *args], capture_output=True, text=True, timeout=600, env=env, cwd=home
        )

    started = time.monotonic()
    ran = reef_pi("-p", "Say hello.")
    assert time.monotonic() - started < 300  # a loaded CI machine; bench/speed/agents.py: < 60 s
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip()
    session = (home / ".reef/harness/pi/default/last-session").read_text().strip()
    records = httpx.get(
        f"{server.url}/reef/records", params={"order": "desc", "limit": 50}, headers=HEADERS
    ).json()["data"]
    mine = [r for r in records if r["session"] == session]
    assert mine, "pi's calls should be recorded under the reef-pi session"
    assert all(r["release_id"] == "default@1" for r in mine)
    assert any(r["request"].get("tools") for r in mine), "pi sends its tools"

    reported = reef_pi("report", "--score", "1", "--feedback", "good")
    assert reported.returncode == 0, reported.stderr
    report_id = reported.stdout.strip()
    newest = mine[0]["id"]  # reef-pi report scores the session's last call
    record = httpx.get(f"{server.url}/reef/records/{newest}", headers=HEADERS).json()
    assert [r["id"] for r in record["reports"]] == [report_id]

    publish(harness(project / "h2", "You are a careful coding agent.", {"max_tokens": 24}), project)
    deadline = time.monotonic() + 5
    while (
        httpx.get(f"{server.url}/reef/harness", headers=HEADERS).json()["release_id"] != "default@2"
    ):
        assert time.monotonic() < deadline
    again = reef_pi("-p", "Say hi.")
    assert "a new harness version is available (default@1 → default@2)" in again.stderr
    updated = reef_pi("update")
    assert updated.returncode == 0, updated.stderr
    assert (home / ".reef/harness/pi/default/release").read_text().strip() == "default@2"


# -- install scripts are safe to run, also under python -O and over a broken models.json ------


def test_a_line_equal_to_its_heredoc_delimiter_is_refused_even_under_python_o() -> None:
    assert unused_delimiter("REEF_X", "a\nREEF_XY\nb") == "REEF_X"
    check = (
        "from reef.harness.installers import UnsafeScript, unused_delimiter\n"
        "try:\n"
        "    unused_delimiter('REEF_X', 'a\\nREEF_X\\nrm -rf ~')\n"
        "except UnsafeScript as error:\n"
        "    print(error.message)\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", check], capture_output=True, text=True)
    assert "a line of it is 'REEF_X'" in result.stdout, result.stdout + result.stderr


def install_pi(server: ServerProcess, home: Path) -> subprocess.CompletedProcess[str]:
    """The pi install script, run with a stand-in `pi` on PATH (so npm never runs)."""
    stand_in = home / "stand-in"
    stand_in.mkdir(exist_ok=True)
    (stand_in / "pi").write_text("#!/bin/sh\nexit 0\n")
    (stand_in / "pi").chmod(0o755)
    return run_script(install_script(server, "pi"), home, PATH=f"{stand_in}:{os.environ['PATH']}")


needs_node = pytest.mark.usefixtures("node")  # skipped without Node, failed in CI


@needs_node
@pytest.mark.parametrize("unreadable", ['{"providers": {"mine": ', "[1, 2]", '{"providers": 5}'])
def test_pi_installer_backs_up_a_models_file_it_cannot_read(
    server: ServerProcess, tmp_path: Path, unreadable: str
) -> None:
    models = tmp_path / ".pi/agent/models.json"
    models.parent.mkdir(parents=True)
    models.write_text(unreadable)
    result = install_pi(server, tmp_path)
    assert result.returncode == 0, result.stderr
    backups = list(models.parent.glob("models.json.bak-*"))
    assert [backup.read_text() for backup in backups] == [unreadable]
    assert f"kept it as {backups[0]}" in result.stderr
    assert json.loads(models.read_text())["providers"]["reef"]["baseUrl"] == f"{server.url}/v1"


@needs_node
def test_pi_installer_keeps_the_providers_already_configured(
    server: ServerProcess, tmp_path: Path
) -> None:
    models = tmp_path / ".pi/agent/models.json"
    models.parent.mkdir(parents=True)
    models.write_text(json.dumps({"providers": {"mine": {"baseUrl": "http://example/v1"}}}))
    result = install_pi(server, tmp_path)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(models.read_text())["providers"]) == {"mine", "reef"}
    assert not list(models.parent.glob("models.json.bak-*")) and "kept it" not in result.stderr
