"""The agents an episode can run, each as the command line the sandbox runs and the
environment it gets (the episode's token, never a Reef token or an upstream key).

- `native`: Reef's own loop (native_agent.py), run with the host's Python.
- `oracle`: the task's solution/solve.sh, which shows the task's test can pass.
- `pi`, `codex`, `claude`, `opencode`: the coding agents the harness adapters install. The
  adapter's install script (fetched by the runner with its own token, so it renders the
  scenario's tree) runs inside the sandbox first, into the sandbox's HOME; the agent's binary
  must already be on the host (the sandbox has no network to install it with npm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reef.episodes.sandbox import INSIDE_PACKAGE, python_path

INSTRUCTION = "/logs/agent/instruction.md"
TRAJECTORY = "/logs/agent/trajectory.jsonl"
INSTALL_SCRIPT = "/logs/agent/install.sh"
ADAPTER_AGENTS = ("pi", "codex", "claude", "opencode")
AGENTS = ("native", "oracle", *ADAPTER_AGENTS)
# What each installed agent runs, non-interactively, on the instruction ($TASK holds it).
ADAPTER_COMMANDS = {
    "pi": '"$HOME/.local/bin/reef-pi" --print "$TASK"',
    "codex": '"$HOME/.local/bin/reef-codex" exec --skip-git-repo-check "$TASK"',
    "claude": '"$HOME/.local/bin/reef-claude" -p --dangerously-skip-permissions "$TASK"',
    "opencode": '"$HOME/.local/bin/reef-opencode" run "$TASK"',
}


class UnknownAgent(ValueError):
    pass


@dataclass(frozen=True)
class AgentRun:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)
    needs_install_script: bool = False


def agent_run(
    agent: str,
    *,
    solution: Path | None,
    base_url: str,
    token: str,
    scenario: str,
    model: str,
    seed: int,
    max_steps: int,
) -> AgentRun:
    """How the sandbox runs `agent`: `base_url` is Reef as the sandbox reaches it."""
    reef_env = {"REEF_URL": base_url, "REEF_TOKEN": token, "REEF_SCENARIO": scenario}
    if agent == "native":
        openai_env = {"OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_KEY": token}
        command = [python_path(), f"{INSIDE_PACKAGE}/native_agent.py"]
        command += ["--instruction", INSTRUCTION, "--trajectory", TRAJECTORY, "--model", model]
        command += ["--max-steps", str(max_steps), "--seed", str(seed)]
        return AgentRun(command, {**reef_env, **openai_env, "PYTHONNOUSERSITE": "1"})
    if agent == "oracle":
        if solution is None:
            raise UnknownAgent("this task has no solution/solve.sh for the oracle to run")
        return AgentRun(["bash", "/solution/solve.sh"], mounts={"/solution": solution.parent})
    if agent in ADAPTER_COMMANDS:
        install = f"sh {INSTALL_SCRIPT} >/logs/agent/install.log 2>&1 || exit 90"
        script = f'{install}; TASK="$(cat {INSTRUCTION})"; '
        command = ["bash", "-c", script + ADAPTER_COMMANDS[agent]]
        return AgentRun(command, reef_env, needs_install_script=True)
    raise UnknownAgent(f"no agent {agent!r}: agents are {', '.join(AGENTS)}")
