"""One episode: an agent on a task, in a sandbox, against a running Reef; scored by the test.

`run_episode` makes a fresh workspace, mints the episode's token, runs the agent (its calls
recorded in a session of their own, tagged `episode`, `task`, `tree`), then runs the task's
test in a second sandbox with no network, reads the reward, and reports it on the episode's
records. `run_paired` runs two trees on the same tasks, same seeds, interleaved: what a gate
compares.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reef.client import ReefClient, ReefClientError, env_token
from reef.episodes.agents import INSTALL_SCRIPT, AgentRun, UnknownAgent, agent_run
from reef.episodes.sandbox import Sandbox, SandboxMode, require_sandbox
from reef.episodes.supervision import LimitNotEnforced, Limits, SandboxResult, enforcement
from reef.episodes.tasks import BadTask, Task, check_task_folders
from reef.episodes.tokens import EpisodeGrant, mint
from reef.episodes.untrusted import UnsafePath, read_sandbox_file
from reef.episodes.workspace import (
    Workspace,
    create_workspace,
    give_to_sandbox,
    release_workspace,
)
from reef.scenario import DEFAULT_SCENARIO
from reef.urls import without_password

TEST_OUTPUT_IN_REPORT = 4000
TOKEN_GRACE_S = 120.0  # past the agent's wall time: calls still in flight end, then it expires
REWARD_BYTES = 4096
TRAJECTORY_BYTES = 16 * 1024 * 1024

logger = logging.getLogger(__name__)
_told_enforcement = False


class EpisodeError(RuntimeError):
    """An episode that cannot run (no sandbox, Reef not on loopback, no token to sign with)."""


@dataclass(frozen=True)
class EpisodeSettings:
    limits: Limits = field(default_factory=Limits)
    sandbox: SandboxMode = "bwrap"
    max_steps: int = 20  # the native agent's
    work_root: Path | None = None  # where workspaces go (a temporary folder when None)
    keep_workspace: bool = True


@dataclass
class Episode:
    id: str
    task: str
    group: str
    agent: str
    tree: str
    scenario: str
    seed: int
    reward: float | None = None
    agent_run: SandboxResult | None = None
    verifier_run: SandboxResult | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)  # the episode's records
    commands: list[dict[str, Any]] = field(default_factory=list)  # the agent's steps
    report_id: str | None = None
    workspace: Path | None = None
    error: str | None = None  # why it did not run, or could not be scored

    @property
    def passed(self) -> bool:
        return self.reward is not None and self.reward >= 1.0

    @property
    def limit(self) -> str | None:
        """The limit that stopped the agent or the test, if one did."""
        for run in (self.agent_run, self.verifier_run):
            if run is not None and run.limit is not None:
                return run.limit
        return None

    @property
    def test_output(self) -> str:
        return self.verifier_run.output if self.verifier_run is not None else ""

    @property
    def output_truncated(self) -> bool:
        """Whether the agent's or the test's output passed its cap and was cut."""
        runs = (self.agent_run, self.verifier_run)
        return any(run is not None and run.output_truncated for run in runs)

    def summary(self) -> dict[str, Any]:
        """The episode as plain data (what `reef tasks run --json` prints)."""
        return {
            "id": self.id,
            "task": self.task,
            "agent": self.agent,
            "tree": self.tree,
            "seed": self.seed,
            "reward": self.reward,
            "passed": self.passed,
            "limit": self.limit,
            "output_truncated": self.output_truncated,
            "error": self.error,
            "calls": [call.get("id") for call in self.calls],
            "steps": recorded_steps(self.calls),  # as the server recorded them
            "commands": self.commands,  # as the agent's trajectory says (its claim)
            "agent_output": self.agent_run.output if self.agent_run else "",
            "test_output": self.test_output,
            "report_id": self.report_id,
        }


def run_episode(
    task: Task,
    agent: str,
    reef_url: str,
    *,
    tree: str = "current",
    scenario: str = DEFAULT_SCENARIO,
    seed: int = 0,
    token: str | None = None,
    signing_token: str | None = None,
    settings: EpisodeSettings | None = None,
    episode_id: str | None = None,
) -> Episode:
    """Run `agent` on `task` against the Reef at `reef_url` (on this machine's loopback).

    `token` is the caller's Reef token (REEF_TOKEN when None): it reads the episode's records
    and reports on them, and never enters the sandbox. `signing_token` signs the episode's
    token (`token` when None); `tree` is the label the calls are tagged with (a gate runs the
    candidate's tree in the scenario that serves it)."""
    settings = settings or EpisodeSettings()
    token = env_token() if token is None else token
    episode = Episode(
        id=episode_id or new_episode_id(task.name),
        task=task.name,
        group=task.group,
        agent=agent,
        tree=tree,
        scenario=scenario,
        seed=seed,
    )
    if task.needs_image:
        episode.error = "needs its image: " + "; ".join(task.image_installs)
        return episode
    require_sandbox(settings.sandbox)
    _tell_enforcement(settings.limits)
    port = loopback_port(reef_url)
    try:
        workspace = _prepare(task, episode, settings)
    except (BadTask, UnsafePath) as error:
        episode.error = f"task refused: {error}"
        return episode
    try:
        _run_prepared(task, episode, workspace, reef_url, port, token, signing_token, settings)
    except LimitNotEnforced as error:  # never run without its limits: refused, the suite goes on
        episode.error = f"episode refused: {error}"
    finally:
        release_workspace(workspace, keep=settings.keep_workspace)
    return episode


def _run_prepared(
    task: Task,
    episode: Episode,
    workspace: Workspace,
    reef_url: str,
    port: int,
    token: str | None,
    signing_token: str | None,
    settings: EpisodeSettings,
) -> None:
    with ReefClient(reef_url, token=token) as client:
        limits = settings.limits.within(task.agent_timeout_s, task.memory_mb, task.cpus)
        scenario = episode.scenario
        grant = EpisodeGrant(
            scenario,
            episode.id,
            task.name,
            episode.tree,
            time.time() + limits.wall_time_s + TOKEN_GRACE_S,
        )
        episode_token = mint(grant, signing_token or token or _no_signer(reef_url))
        sandbox_url = f"http://127.0.0.1:{port}"
        try:
            run = agent_run(
                episode.agent,
                solution=task.solution,
                base_url=sandbox_url,
                token=episode_token,
                scenario=scenario,
                model=_served_model(client, scenario),
                seed=episode.seed,
                max_steps=settings.max_steps,
            )
        except UnknownAgent as error:
            episode.error = str(error)
            return
        if run.needs_install_script:
            _write_install_script(client, episode.agent, scenario, workspace, sandbox_url)
        episode.agent_run = _run_agent(run, workspace, limits, port, settings)
        episode.commands, trajectory_problem = read_commands(workspace.logs)
        try:
            verifier = workspace.for_verifier()
        except OSError as error:  # the agent filled the workspace: no room for the test's folders
            episode.error = (
                f"verifier error: the test could not be set up ({error.strerror}): the agent "
                "left the workspace full, and an episode whose test cannot run never passes"
            )
            episode.calls = episode_records(client, episode)
            episode.report_id = report_episode(client, episode)
            return
        episode.verifier_run = _run_test(task, verifier, settings)
        episode.reward, problem = verdict(episode.verifier_run, verifier.verifier_logs)
        episode.error = episode.error or problem or trajectory_problem
        episode.calls = episode_records(client, episode)
        episode.report_id = report_episode(client, episode)


def _tell_enforcement(limits: Limits) -> None:
    """Once a process: which limits hold only by polling on this machine, and why."""
    global _told_enforcement
    sentence = enforcement(limits)
    if sentence and not _told_enforcement:
        logger.warning("%s", sentence)
    _told_enforcement = True


def run_paired(
    tasks: list[Task],
    agent: str,
    reef_url: str,
    sides: dict[str, str],
    *,
    repeats: int = 1,
    seed: int = 0,
    on_episode: Callable[[Episode], None] | None = None,
    **options: Any,
) -> list[tuple[Episode, Episode]]:
    """Each task `repeats` times on both sides (tree label -> scenario serving it), same task
    and seed on both, interleaved (the side that goes first alternates), as a gate pairs them;
    answers (first side's, second side's) pairs in `sides`' order."""
    (first, first_scenario), (second, second_scenario) = sides.items()
    pairs = []
    for task, repeat in _schedule(tasks, repeats):
        order = [(first, first_scenario), (second, second_scenario)]
        if repeat % 2:
            order.reverse()
        ran = {}
        for tree, scenario in order:
            episode = run_episode(
                task, agent, reef_url, tree=tree, scenario=scenario, seed=seed + repeat, **options
            )
            ran[tree] = episode
            if on_episode is not None:
                on_episode(episode)
        pairs.append((ran[first], ran[second]))
    return pairs


def _schedule(tasks: list[Task], repeats: int) -> Iterator[tuple[Task, int]]:
    for repeat in range(repeats):
        for task in tasks:
            yield task, repeat


def new_episode_id(task_name: str) -> str:
    plain = re.sub(r"[^A-Za-z0-9_.-]", "-", task_name)[:48].strip("-.") or "task"
    return f"ep-{plain}-{secrets.token_hex(6)}"


def loopback_port(reef_url: str) -> int:
    """The port of a Reef on this machine: the sandbox's relay reaches 127.0.0.1 only."""
    parts = urlsplit(reef_url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise EpisodeError(
            f"episodes reach Reef on this machine's loopback; {without_password(reef_url)} is "
            "not: run the episodes on the server's machine, at http://127.0.0.1:PORT"
        )
    return parts.port or (443 if parts.scheme == "https" else 80)


def _no_signer(reef_url: str) -> str:
    raise EpisodeError(
        "no token to sign the episode's token with: set REEF_TOKEN (a token of the server at "
        f"{without_password(reef_url)})"
    )


def _prepare(task: Task, episode: Episode, settings: EpisodeSettings) -> Workspace:
    """The episode's workspace, the task checked again first (it may have changed since it
    was loaded): nothing of it may lead out of its folder."""
    check_task_folders(task.path)
    root = settings.work_root or Path(os.environ.get("TMPDIR", "/tmp")) / "reef-episodes"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    workspace = create_workspace(root / episode.id, task.environment, settings.limits.disk_mb)
    episode.workspace = workspace.root
    (workspace.logs / "agent" / "instruction.md").write_text(task.instruction)
    give_to_sandbox(workspace)
    return workspace


def _served_model(client: ReefClient, scenario: str) -> str:
    try:
        models = client.get("/v1/models").get("data") or []
    except ReefClientError:
        return "default"
    return str(models[0]["id"]) if models else "default"


def _write_install_script(
    client: ReefClient, agent: str, scenario: str, workspace: Workspace, sandbox_url: str
) -> None:
    """The adapter's install script for the scenario's tree, pointed at Reef as the sandbox
    reaches it; it holds no token (it reads REEF_TOKEN when it runs)."""
    response = client._http.get(  # a shell script, not JSON
        "/reef/harness/install",
        params={"adapter": agent, "scenario": scenario},
        headers={"host": urlsplit(sandbox_url).netloc, "x-reef-scenario": scenario},
    )
    if response.status_code != 200:
        answer = f"HTTP {response.status_code}: {response.text[:300]}"
        raise EpisodeError(f"cannot get the {agent} install script: {answer}")
    path = workspace.logs / "agent" / Path(INSTALL_SCRIPT).name
    path.write_text(response.text)
    give_to_sandbox(workspace)


def _run_agent(
    run: AgentRun, workspace: Workspace, limits: Limits, port: int, settings: EpisodeSettings
) -> SandboxResult:
    sandbox = Sandbox(workspace, limits, reef_port=port, mounts=run.mounts, mode=settings.sandbox)
    return sandbox.run(run.command, run.env)


# The verifier's environment: no module of the working folder or a user site on Python's path
# (an agent's /app/json.py is not the json a test imports), and git reading no system or user
# config and running no program a repository's config could still name.
VERIFIER_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PYTHONSAFEPATH": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_COUNT": "5",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": "/dev/null",
    "GIT_CONFIG_KEY_2": "core.pager",
    "GIT_CONFIG_VALUE_2": "cat",
    "GIT_CONFIG_KEY_3": "core.editor",
    "GIT_CONFIG_VALUE_3": "true",
    "GIT_CONFIG_KEY_4": "core.sshCommand",
    "GIT_CONFIG_VALUE_4": "false",
}


def _run_test(task: Task, verifier: Workspace, settings: EpisodeSettings) -> SandboxResult:
    """The task's test, in a sandbox of its own with no network at all, on what the agent left
    in /app and nothing else of the agent's: its own /logs/verifier, home and /tmp, its own
    uid (as root), and nothing of the agent's on a search path (`VERIFIER_ENV`)."""
    limits = settings.limits.within(task.verifier_timeout_s, task.memory_mb, task.cpus)
    sandbox = Sandbox(verifier, limits, mounts={"/tests": task.tests}, mode=settings.sandbox)
    return sandbox.run(["bash", "/tests/test.sh"], VERIFIER_ENV)


def verdict(run: SandboxResult, verifier_logs: Path) -> tuple[float | None, str | None]:
    """The episode's reward and what went wrong: a test that ended by a limit, a signal or an
    error never passes, whatever it wrote before (a test hung on a FIFO the agent left, after
    it wrote 1, is a verifier error, not a pass)."""
    reward, problem = read_reward(verifier_logs)
    if run.limit is not None:
        return None, f"verifier error: the test was stopped by its {run.limit} limit"
    if run.exit_code is None or run.exit_code < 0:
        return None, "verifier error: the test was ended by a signal"
    if run.exit_code != 0 and reward is not None and reward > 0:
        return None, f"verifier error: the test failed (exit {run.exit_code}) after a reward"
    return reward, problem


def read_reward(verifier_logs: Path) -> tuple[float | None, str | None]:
    """The reward the test wrote (reward.txt: a number; else reward.json: {"reward": x} or a
    single number), and what was wrong when there is none. Each is read as a regular file of
    at most 4 KiB, never through a link; a reward.txt that is anything else is a verifier
    error, never a reason to read reward.json."""
    try:
        text = read_sandbox_file(verifier_logs, "reward.txt", REWARD_BYTES)
        if text is not None:
            return _finite(text.decode(errors="replace").strip()), None
        data = read_sandbox_file(verifier_logs, "reward.json", REWARD_BYTES)
        if data is not None:
            parsed = json.loads(data)
            value = parsed.get("reward") if isinstance(parsed, dict) else parsed
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError("no number")
            return _finite(value), None
    except UnsafePath as error:
        return None, f"verifier error: /logs/verifier/{error}"
    except (ValueError, TypeError):
        return None, "the test wrote a reward that is not a number"
    return None, "the test wrote no reward (/logs/verifier/reward.txt or reward.json)"


def _finite(value: str | float) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def read_commands(agent_logs: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The agent's steps from `agent/trajectory.jsonl` under its /logs, read as a regular file
    of bounded size, never through a link; and what was wrong with it, if anything. The agent
    wrote it: a line nested deeper than `MAX_STEP_DEPTH`, longer than `MAX_STEP_BYTES`, or not
    JSON is counted and said, never parsed into a crash (a 100,000-deep line raised
    RecursionError and ended the whole suite's run)."""
    try:
        data = read_sandbox_file(agent_logs, "agent/trajectory.jsonl", TRAJECTORY_BYTES)
    except UnsafePath as error:
        return [], f"the agent's trajectory is refused: /logs/{error}"
    steps, bad = [], 0
    for line in (data or b"").decode(errors="replace").splitlines():
        step = parse_step(line)
        if step is None:
            bad += line.strip() != ""
        else:
            steps.append(step)
    said = f"{bad} line(s) of the agent's trajectory could not be read" if bad else None
    return steps, said


MAX_STEP_DEPTH = 32  # nesting a step's JSON may have
MAX_STEP_BYTES = 1024 * 1024


def parse_step(line: str) -> dict[str, Any] | None:
    """One trajectory line as a step, or None for a line that is not one (too deep, too long,
    not JSON, not an object), checked before the parser sees it."""
    if len(line) > MAX_STEP_BYTES or _depth(line) > MAX_STEP_DEPTH:
        return None
    try:
        step = json.loads(line)
    except ValueError:
        return None  # the agent was killed mid-line, or wrote something else
    return step if isinstance(step, dict) else None


def _depth(line: str) -> int:
    """How deep a JSON line nests, counting brackets outside strings."""
    deepest = depth = 0
    in_string = escaped = False
    for char in line:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


STEP_CHARS = 200  # of a recorded step's arguments or answer


def recorded_steps(calls: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What the model asked for, call by call, as the server recorded it: each tool call it
    returned (name and arguments), or its answer. The episode's steps as they happened at the
    server, which nothing in the sandbox can rewrite; the agent's trajectory.jsonl
    (`Episode.commands`) is its own account of them."""
    steps: list[dict[str, str]] = []
    for record in calls:
        choices = (record.get("response") or {}).get("choices") or [{}]
        message = _object(_object(choices[0]).get("message"))
        tool_calls = message.get("tool_calls") or []
        for call in tool_calls:
            function = _object(_object(call).get("function"))
            arguments = str(function.get("arguments") or "")[:STEP_CHARS]
            steps.append({"tool": str(function.get("name") or "?"), "arguments": arguments})
        if not tool_calls:
            steps.append({"answer": str(message.get("content") or "")[:STEP_CHARS]})
    return steps


def _object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (a record is data, any shape)."""
    return value if isinstance(value, dict) else {}


def describe_step(step: Mapping[str, object]) -> str:
    """An agent's step as a reader reads it: `tool {arguments}`, its final answer, or why it
    stopped."""
    if step.get("tool"):
        return f"{step['tool']} {step.get('arguments') or ''}".strip()
    return str(step.get("answer") or step.get("stopped") or "")


def episode_records(client: ReefClient, episode: Episode) -> list[dict[str, Any]]:
    """Every record of the episode (its calls are tagged with its id), oldest first."""
    records: list[dict[str, Any]] = []
    after = None
    while True:
        page = client.records(
            episode.scenario, limit=1000, after=after, tags=[f"episode:{episode.id}"]
        )
        records += page["data"]
        if not page.get("has_more") or not page["data"]:
            return records
        after = page["data"][-1]["id"]


def report_episode(client: ReefClient, episode: Episode) -> str | None:
    """The test's result as a report on the episode's records (none when it made no call)."""
    if not episode.calls or episode.reward is None:
        return None
    feedback = {
        "episode": episode.id,
        "task": episode.task,
        "tree": episode.tree,
        "agent": episode.agent,
        "passed": episode.passed,
        "limit": episode.limit,
        "test_output": episode.test_output[-TEST_OUTPUT_IN_REPORT:],
    }
    stored = client.report(
        [call["id"] for call in episode.calls][-1000:],
        score=episode.reward,
        feedback=feedback,
        scenario=episode.scenario,
        report_id=f"{episode.id}-test",
    )
    return str(stored.get("id") or f"{episode.id}-test")
