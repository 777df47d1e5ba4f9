"""The codex, claude and opencode harness adapters: install scripts run in an empty HOME, their
wrappers run with stand-in agents (fast: what each execs, with which environment), and the real
agents (npm @openai/codex, @anthropic-ai/claude-code, opencode-ai; installed by the script when
missing, and by .ci/run beforehand) run one non-interactive prompt through Reef on the embedded
model, recorded under their session and reported on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.errors import BadRequest, NotFound
from reef.harness.installers import AGENT_PACKAGES, render_install
from reef.testing.processes import ServerProcess
from tests.conftest import TOKEN
from tests.support.harness_server import HEADERS, harness_project, install_script, serving

AGENT_BOUND_S = 300  # one prompt through a real agent, end to end
AGENTS = ("codex", "claude", "opencode")
# One non-interactive prompt per agent, as its wrapper takes it.
PROMPTS = {
    "codex": ["exec", "--skip-git-repo-check", "Say hello."],
    "claude": ["-p", "Say hello."],
    "opencode": ["run", "Say hello."],
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("agent-project")
    # The agents' prompts are thousands of tokens (Codex's about 4,600 with its instructions):
    # the embedded model's largest context, and short answers. The harness ends an answer at
    # its first clause, greedily, so it is complete rather than cut by the cap: the agents fail
    # a cut answer (Codex on "incomplete", Claude Code on max_tokens), and a sampled first line
    # of the 135M model has run past 48 tokens. None of the agents sends stop or temperature.
    config = "engine:\n  llamacpp: {n_ctx: 8192, n_threads: 2, max_tokens_cap: 128}\n"
    short = {"stop": ["\n", ". ", "! ", ", "], "temperature": 0}
    return harness_project(folder, config, "You are a coding agent. Answer in one line.", short)


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[ServerProcess]:
    with serving(project) as running:
        yield running


def environment(home: Path, path: str = os.environ["PATH"]) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "REEF_TOKEN": TOKEN,
        "PATH": f"{home / '.local/bin'}:{path}",
    }


def install(
    server: ServerProcess, adapter: str, home: Path, path: str = os.environ["PATH"]
) -> None:
    result = subprocess.run(
        ["sh"],
        input=install_script(server, adapter),
        capture_output=True,
        text=True,
        timeout=900,
        env=environment(home, path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{adapter} harness default@1 installed" in result.stdout


def stand_ins(home: Path) -> str:
    """A PATH whose codex, claude and opencode print how they were called."""
    folder = home / "stand-in"
    folder.mkdir()
    for name in AGENTS:
        (folder / name).write_text(
            "#!/bin/sh\n"
            f'echo "{name} $*"\n'
            'echo "session=$REEF_SESSION scenario=$REEF_SCENARIO"\n'
            'echo "headers=$ANTHROPIC_CUSTOM_HEADERS" | tr "\\n" " "\n'
        )
        (folder / name).chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def written_files(home: Path) -> list[Path]:
    return [path for path in home.rglob("*") if path.is_file() and "stand-in" not in path.parts]


@pytest.mark.parametrize("adapter", AGENTS)
def test_scripts_are_listed_valid_sh_and_hold_no_token(server: ServerProcess, adapter: str) -> None:
    listed = httpx.get(f"{server.url}/reef/harness/adapters", headers=HEADERS).json()["data"]
    assert adapter in {entry["name"] for entry in listed}
    text = install_script(server, adapter)
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert TOKEN not in text and server.url in text and AGENT_PACKAGES[adapter] in text


@pytest.mark.usefixtures("node")
@pytest.mark.parametrize("adapter", AGENTS)
def test_wrappers_exec_the_agent_in_a_session_and_announce_new_releases(
    server: ServerProcess, adapter: str, tmp_path: Path
) -> None:
    path = stand_ins(tmp_path)
    install(server, adapter, tmp_path, path)
    assert all(TOKEN not in file.read_text() for file in written_files(tmp_path))
    dest = tmp_path / f".reef/harness/{adapter}/default"
    assert (dest / "tree/skills/search/SKILL.md").exists()
    (dest / "release").write_text("default@0\n")  # an install older than the head
    ran = subprocess.run(
        [f"reef-{adapter}", *PROMPTS[adapter]],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(tmp_path, path),
    )
    assert ran.returncode == 0, ran.stderr
    session = (dest / "last-session").read_text().strip()
    assert session.startswith(f"reef-{adapter}-")
    assert f"session={session} scenario=default" in ran.stdout
    assert (
        f"a new harness version is available (default@0 → default@1): run reef-{adapter} update"
        in ran.stderr
    )
    expected = {
        "codex": "codex exec --profile reef --skip-git-repo-check Say hello.",
        "claude": "claude -p Say hello.",
        "opencode": "opencode run --model reef/SmolLM2-135M-Instruct.Q4_1 Say hello.",
    }[adapter]
    assert ran.stdout.splitlines()[0] == expected
    if adapter == "claude":
        assert f"headers=x-reef-scenario: default x-reef-session: {session}" in ran.stdout


@pytest.mark.usefixtures("node")
def test_configs_point_at_reef_and_keep_what_was_there(
    server: ServerProcess, tmp_path: Path
) -> None:
    path = stand_ins(tmp_path)
    settings = tmp_path / ".claude/settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"theme": "dark", "env": {"MINE": "1"}}))
    opencode = tmp_path / ".config/opencode/opencode.json"
    opencode.parent.mkdir(parents=True)
    opencode.write_text(json.dumps({"provider": {"mine": {"npm": "x"}}}))
    for adapter in AGENTS:
        install(server, adapter, tmp_path, path)
    profile = (tmp_path / ".codex/reef.config.toml").read_text()
    assert 'wire_api = "responses"' in profile and 'env_key = "REEF_TOKEN"' in profile
    assert f'base_url = "{server.url}/v1"' in profile
    claude = json.loads(settings.read_text())
    assert claude["theme"] == "dark" and claude["env"]["MINE"] == "1"
    assert claude["env"]["ANTHROPIC_BASE_URL"] == server.url
    helper = subprocess.run(
        ["sh", "-c", claude["apiKeyHelper"]],
        capture_output=True,
        text=True,
        env=environment(tmp_path),
    )
    assert helper.stdout == TOKEN  # read from the environment when Claude Code asks
    providers = json.loads(opencode.read_text())["provider"]
    assert set(providers) == {"mine", "reef"}
    assert providers["reef"]["options"]["baseURL"] == f"{server.url}/v1"
    assert providers["reef"]["options"]["apiKey"] == "{env:REEF_TOKEN}"
    assert providers["reef"]["options"]["timeout"] == 900_000  # 15 min: a CPU reads slowly


# -- the real agents -------------------------------------------------------------------------


def needs_agent(adapter: str) -> None:
    """Skip where neither the agent nor npm is here; CI installs the agents (.ci/run)."""
    command = "claude" if adapter == "claude" else adapter
    if shutil.which(command) is None and shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"{command} is missing: .ci/run should have installed it")
        pytest.skip(
            f"{command} is not installed and npm is missing (npm i -g {AGENT_PACKAGES[adapter]})"
        )


@pytest.mark.e2e
@pytest.mark.parametrize("adapter", AGENTS)
def test_the_real_agent_runs_through_reef(
    server: ServerProcess, adapter: str, tmp_path: Path
) -> None:
    needs_agent(adapter)
    install(server, adapter, tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    def wrapper(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [f"reef-{adapter}", *args],
            capture_output=True,
            text=True,
            timeout=900,
            env=environment(tmp_path),
            cwd=work,
            stdin=subprocess.DEVNULL,
        )

    started = time.monotonic()
    ran = wrapper(*PROMPTS[adapter])
    took = time.monotonic() - started
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip()
    # A bound for a loaded CI machine: bench/speed/agents.py measures each under 60 s here.
    assert took < AGENT_BOUND_S, f"{adapter} took {took:.0f} s"
    session = (tmp_path / f".reef/harness/{adapter}/default/last-session").read_text().strip()
    records = httpx.get(
        f"{server.url}/reef/records", params={"order": "desc", "limit": 50}, headers=HEADERS
    ).json()["data"]
    mine = [record for record in records if record["session"] == session]
    assert mine, f"{adapter}'s calls should be recorded under its reef-{adapter} session"
    assert all(record["release_id"] == "default@1" for record in mine)
    # Each sends its tools on every call but opencode's one call for a session title.
    untooled = [record for record in mine if not record["request"].get("tools")]
    assert len(untooled) <= (1 if adapter == "opencode" else 0), f"{adapter} sends its tools"
    assert len(untooled) < len(mine)
    if adapter == "codex":  # on the Responses API
        assert all("responses_api" in record["request"] for record in mine)

    reported = wrapper("report", "--score", "1", "--feedback", "good")
    assert reported.returncode == 0, reported.stderr
    record = httpx.get(f"{server.url}/reef/records/{mine[0]['id']}", headers=HEADERS).json()
    assert [report["id"] for report in record["reports"]] == [reported.stdout.strip()]


# -- names and values written into a script are matched whole -------------------------------


def _render(adapter: str = "codex", **values: str) -> str:
    fields = {"scenario": "default", "release_id": "default@1", "model": "m", **values}
    return render_install(
        adapter,
        base_url="http://127.0.0.1:8900/",
        files={},
        system_prompt="Be brief.",
        context_window=2048,
        **fields,
    )


@pytest.mark.parametrize("field", ["scenario", "release_id", "model"])
@pytest.mark.parametrize("tail", ["\n", "\r\n", "\n; rm -rf ~"])
def test_a_value_with_a_trailing_newline_is_refused(field: str, tail: str) -> None:
    """`$` let a trailing newline through, which ends the line of the script it is written on."""
    clean = {"scenario": "default", "release_id": "default@1", "model": "m"}[field]
    with pytest.raises(BadRequest, match="cannot be written into an install script"):
        _render(**{field: clean + tail})


def test_an_adapter_name_with_a_trailing_newline_is_unknown() -> None:
    assert "codex" in _render()
    with pytest.raises(NotFound, match="no harness adapter"):
        _render("codex\n")


def test_a_file_path_with_a_trailing_newline_is_left_out() -> None:
    script = render_install(
        "codex",
        base_url="http://127.0.0.1:8900/",
        scenario="default",
        release_id="default@1",
        model="m",
        files={"kept.md": b"kept", "dropped.md\n": b"dropped"},
        system_prompt="Be brief.",
        context_window=2048,
    )
    assert "kept.md" in script and "dropped" not in script
