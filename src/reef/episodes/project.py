"""Episodes against the project's own running server, as the gate and the learning worker run
them: the sandbox and limits `episodes:` configures, the server that serves the state folder
(its internal token signs the episodes' tokens), and the token that reads and reports their
records (the configured one; none on a server without tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reef.config import EpisodesConfig, ReefConfig
from reef.episodes.runner import Episode, EpisodeError, EpisodeSettings, run_episode
from reef.episodes.sandbox import Limits
from reef.episodes.tasks import load_suite
from reef.inference.server_file import find_running_server


def episode_settings(config: EpisodesConfig) -> EpisodeSettings:
    """The sandbox and limits `episodes:` in reef.yaml configures."""
    limits = Limits(
        wall_time_s=config.wall_time_s,
        cpu_time_s=config.cpu_time_s,
        memory_mb=config.memory_mb,
        processes=config.processes,
        disk_mb=config.disk_mb,
        output_bytes=config.output_bytes,
    )
    return EpisodeSettings(limits=limits, sandbox=config.sandbox, max_steps=config.max_steps)


@dataclass(frozen=True)
class ProjectServer:
    url: str
    signing_token: str  # the server's internal token, which signs the episodes' own tokens
    token: str  # reads and reports the episodes' records ('' on a server without tokens)


def project_server(config: ReefConfig) -> ProjectServer:
    """The server serving `config`'s state folder; `EpisodeError` saying to start one."""
    server = find_running_server(config.state_dir)
    if server is None:
        raise EpisodeError(
            "episodes run the agent against the running server, and none serves "
            f"{config.state_dir}: start `reef serve`"
        )
    token = next(iter([*config.token_values(), *config.admin_token_values()]), "")
    return ProjectServer(server.url, server.token, token)


def project_episodes(
    config: ReefConfig,
    scenario: str,
    tasks: str | Path,
    agent: str = "native",
    repeats: int = 1,
    tree: str = "current",
) -> list[Episode]:
    """`agent` on each task of `tasks`, `repeats` times (seeds 0, 1, …), on the project's
    server under what `scenario` serves, or under `tree` (`trial:<digest>`: a tree a recipe
    tries, `reef.episodes.tokens`)."""
    server, settings = project_server(config), episode_settings(config.episodes)
    return [
        run_episode(
            task,
            agent,
            server.url,
            tree=tree,
            scenario=scenario,
            seed=repeat,
            token=server.token,
            signing_token=server.signing_token,
            settings=settings,
        )
        for repeat in range(repeats)
        for task in load_suite(tasks)
    ]
