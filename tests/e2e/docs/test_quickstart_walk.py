"""docs/quickstart.md walked end to end as a newcomer runs it: every command of its code blocks,
as written, in a fresh folder, on the embedded model and the default port (8900).

What is not run here, and why: the install line (`pip install -e .`: this test runs inside that
install; CI runs the README's two commands on a fresh machine), and the first `reef serve` (the
project's `cd my-agent && reef serve` below it is the one walked: two servers cannot share the
port). `$RECEIPT` is the receipt the Python snippet leaves in `receipt`, as the doc says.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.testing.processes import ServerProcess

QUICKSTART = Path(__file__).resolve().parents[3] / "docs" / "quickstart.md"
URL = "http://127.0.0.1:8900"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)

pytestmark = pytest.mark.e2e


def blocks() -> list[tuple[str, str]]:
    """The doc's code blocks, in order: (language, text)."""
    return [(lang, text) for lang, text in BLOCK.findall(QUICKSTART.read_text())]


def block_with(needle: str, lang: str = "sh") -> str:
    return next(text for kind, text in blocks() if kind == lang and needle in text)


def environment(**extra: str) -> dict[str, str]:
    """The newcomer's shell: the installed `reef` first on PATH, nothing else of the test's."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    return {**env, "PATH": path, "COLUMNS": "160", **extra}


def sh(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def commands(text: str) -> Iterator[str]:
    """Each command line of a block, its comment taken off; continued lines joined."""
    for line in text.replace("\\\n", " ").splitlines():
        command = line.split(" #")[0]
        if command.strip():
            yield command.strip()


def served(command: str, cwd: Path, env: dict[str, str]) -> ServerProcess:
    """A `reef serve` line of the doc, started in the background as the newcomer leaves it."""
    if _listening():
        pytest.fail(f"something already serves {URL}: the quickstart's port must be free")
    return ServerProcess(["bash", "-c", f"exec {command}"], 8900, cwd, env=env).start(timeout=300)


def _listening() -> bool:
    try:
        httpx.get(f"{URL}/healthz", timeout=1)
    except httpx.TransportError:
        return False
    return True


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    env = environment()
    install = block_with("pip install")
    assert "reef serve" in install  # the README's first command, run by CI on a fresh machine

    init, serve = block_with("reef init").split("\n")[:2]
    ran = sh(init.split("  #")[0], tmp_path, env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    project = tmp_path / "my-agent"
    assert (project / "reef.yaml").is_file() and (project / "evals/default.jsonl").is_file()
    folder, _, command = serve.partition("&&")
    assert folder.split() == ["cd", "my-agent"]
    server = served(command.strip(), project, env)
    try:
        walk(project, env)
    finally:
        server.stop()

    token_block = block_with("REEF_TOKEN")
    export, serve_wide = list(commands(token_block))
    token = sh(f"{export} && echo $REEF_TOKEN", project, env).stdout.strip()
    assert len(token) >= 24
    wide = served(serve_wide, project, environment(REEF_TOKEN=token))
    try:
        assert httpx.get(f"{URL}/healthz").status_code == 200
        assert httpx.get(f"{URL}/v1/models").status_code == 401
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{URL}/v1/models", headers=bearer).status_code == 200
        status = sh("reef status", project, environment(REEF_TOKEN=token))
        assert status.returncode == 0, status.stdout + status.stderr  # the CLI reads the token
    finally:
        wide.stop()


def walk(project: Path, env: dict[str, str]) -> None:
    """The doc's middle, against the project's server: call, stream, report, look, release."""
    scope: dict[str, object] = {}
    exec(block_with("with_raw_response", "python"), scope)  # the doc's own code
    receipt = str(scope["receipt"])
    assert receipt.startswith("rec_")
    exec(block_with("stream=True", "python"), scope)
    assert str(scope["receipt"]).startswith("rec_") and scope["receipt"] != receipt

    env = {**env, "RECEIPT": receipt}
    reported = sh(block_with("/reef/report"), project, env)
    assert reported.returncode == 0 and '"score":1' in reported.stdout.replace(" ", "")
    inline = re.search(r"or `(reef report [^`]+)`", QUICKSTART.read_text())
    assert inline is not None
    again = sh(inline.group(1), project, env)
    assert again.returncode == 0 and "reported" in again.stdout, again.stdout + again.stderr

    for command in commands(block_with("reef status")):
        looked = sh(command, project, env)
        assert looked.returncode == 0, f"{command}: {looked.stdout}{looked.stderr}"
    assert (project / "data.jsonl").read_text().strip()

    publish = list(commands(block_with("reef release publish")))
    for command in publish:
        ran = sh(command, project, env)
        output = ran.stdout + ran.stderr
        if "release publish" in command:  # the gate decides: released (0), or rejected (1)
            assert ran.returncode in (0, 1) and ("released" in output or "rejected" in output)
        else:
            assert ran.returncode == 0, f"{command}: {output}"
    assert shlex.split(publish[0])[0] == "mkdir"
