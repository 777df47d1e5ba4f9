"""`reef tasks list|run DIR`: task suites in Harbor's format, run as sandboxed episodes
against a running Reef (reef.episodes, docs/episodes.md); `reef agent run`: the native agent
itself, as the sandbox runs it."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import as_text, console, errors, fail
from reef.client import DEFAULT_URL, env_token
from reef.config import EpisodesConfig
from reef.episodes.agents import AGENTS
from reef.episodes.project import episode_settings
from reef.episodes.runner import Episode, EpisodeError, EpisodeSettings, run_episode
from reef.episodes.sandbox import EPISODES_PACKAGE, SandboxUnavailable
from reef.episodes.supervision import enforcement
from reef.episodes.tasks import BadTask, Task, load_suite
from reef.inference.server_file import find_advertised

app = typer.Typer(help="Task suites in Harbor's format, run as sandboxed agent episodes.")
agent_app = typer.Typer(help="Reef's native agent.")


@app.command("list")
def list_tasks(
    folder: Annotated[Path, typer.Argument(help="A task, or a folder of tasks.")],
) -> None:
    """The tasks of a suite: their time-outs, whether they have an oracle, what they need."""
    tasks = _suite(folder)
    table = Table(title=f"{len(tasks)} tasks in {as_text(folder)}")
    for column in ("task", "group", "agent timeout", "oracle", "runs here"):
        table.add_column(column)
    for task in tasks:
        runs = "needs its image: " + "; ".join(task.image_installs) if task.needs_image else "yes"
        oracle = "yes" if task.solution else "no"
        # Every string here is the task's own: data, never markup or terminal control.
        name, group, runs = as_text(task.name), as_text(task.group), as_text(runs)
        table.add_row(name, group, f"{task.agent_timeout_s:.0f} s", oracle, runs)
    console.print(table)


@app.command("run")
def run_tasks(
    folder: Annotated[Path, typer.Argument(help="A task, or a folder of tasks.")],
    agent: Annotated[str, typer.Option(help=f"One of: {', '.join(AGENTS)}.")] = "native",
    url: Annotated[str, typer.Option(envvar="REEF_URL", help="The running Reef.")] = DEFAULT_URL,
    scenario: Annotated[
        str, typer.Option(help="The scenario the agent's calls go to.")
    ] = "default",
    tree: Annotated[
        str,
        typer.Option(
            help="The label its records are tagged with; candidate:ID serves the episodes "
            "under that candidate while it is proposed or judged; trial:DIGEST under a tree a "
            "recipe's search wrote (not recorded)."
        ),
    ] = "current",
    seed: Annotated[int, typer.Option(help="The agent's seed.")] = 0,
    sandbox: Annotated[
        str | None, typer.Option(help="bwrap or none (episodes.sandbox by default).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the episodes as JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Run each task of a suite with an agent, in the sandbox; a table of the results."""
    tasks = _suite(folder)
    episodes_config, signer = _episodes_config(config)
    settings = _settings(episodes_config, sandbox)
    token = env_token()
    polled = enforcement(settings.limits)
    if polled:
        errors.print(f"[yellow]note:[/] {polled}", highlight=False, soft_wrap=True)
    episodes = []
    with _progress() as progress:
        bar = progress.add_task(f"{agent} on {len(tasks)} tasks", total=len(tasks))
        for task in tasks:
            progress.update(bar, description=f"{agent}: {task.name}")
            episodes.append(_one(task, agent, url, scenario, tree, seed, token, signer, settings))
            progress.advance(bar)
    if as_json:
        print(json.dumps([episode.summary() for episode in episodes], indent=2))
    else:
        console.print(_results_table(episodes, agent))
    if not all(episode.passed for episode in episodes):
        raise typer.Exit(1)


@agent_app.command(
    "run",
    add_help_option=False,  # --help is the agent's own
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def agent_run(ctx: typer.Context) -> None:
    """The native agent (its options: `reef agent run --help`), as the sandbox runs it:
    OPENAI_BASE_URL and OPENAI_API_KEY from the environment."""
    script = EPISODES_PACKAGE / "native_agent.py"  # run as the sandbox runs it: a script
    os.execv(sys.executable, [sys.executable, str(script), *ctx.args])


def _one(
    task: Task,
    agent: str,
    url: str,
    scenario: str,
    tree: str,
    seed: int,
    token: str,
    signer: str | None,
    settings: EpisodeSettings,
) -> Episode:
    try:
        return run_episode(
            task,
            agent,
            url,
            tree=tree,
            scenario=scenario,
            seed=seed,
            token=token,
            signing_token=token or signer,
            settings=settings,
        )
    except (EpisodeError, SandboxUnavailable) as error:
        fail(str(error))


def _suite(folder: Path) -> list[Task]:
    try:
        return load_suite(folder)
    except BadTask as error:
        fail(str(error), code=2)


def _episodes_config(path: Path | None) -> tuple[EpisodesConfig, str | None]:
    """The config's `episodes:` block, and the running server's internal token (which signs
    episode tokens on a server without tokens) where this project has one."""
    config = project_config(path)
    server = find_advertised(config.state_dir)
    return config.episodes, server.token if server else None


def _settings(config: EpisodesConfig, sandbox: str | None) -> EpisodeSettings:
    mode = sandbox or config.sandbox
    if mode not in ("bwrap", "none"):
        fail(f"--sandbox must be bwrap or none, not {mode!r}", code=2)
    return dataclasses.replace(episode_settings(config), sandbox=mode)  # type: ignore[arg-type]


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _results_table(episodes: list[Episode], agent: str) -> Table:
    passed = sum(episode.passed for episode in episodes)
    table = Table(title=f"{agent}: {passed}/{len(episodes)} passed")
    for column in ("task", "reward", "result", "calls", "steps", "seconds"):
        table.add_column(column)
    for episode in episodes:
        run = episode.agent_run
        seconds = (run.seconds if run else 0) + (
            episode.verifier_run.seconds if episode.verifier_run else 0
        )
        reward = "-" if episode.reward is None else f"{episode.reward:g}"
        table.add_row(
            as_text(episode.task),
            reward,
            _result(episode),
            str(len(episode.calls)),
            str(len(episode.commands)),
            f"{seconds:.1f}",
        )
    return table


def _result(episode: Episode) -> str:
    cut = " (output truncated)" if episode.output_truncated else ""
    if episode.passed:
        return f"[green]pass[/]{cut}"
    if episode.limit:
        return f"[red]limit: {episode.limit}[/]{cut}"
    return f"[red]fail[/]{cut} {as_text(episode.error or '')}".strip()
