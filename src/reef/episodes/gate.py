"""The episode gate: a candidate judged by what an agent does with it, not by chat answers.

With `gate.episodes` set, the gate runs the configured agent on every task of a Harbor suite,
`repeats` times on each side: under the current release (tree `current`) and under the
candidate (tree `candidate:<id>`: the server binds an episode's calls to the candidate's
harness and adapter, `reef.server.state`). Both sides of a pair share the task and the seed
and run one after the other, the side that goes first alternating (`runner.run_paired`). Each
task becomes one of the gate's task results, scored by its mean reward on each side, in the
task's group (`category` in its task.toml), so the gate's policies and group rules decide on
episodes as they decide on chat tasks.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from reef.config import EpisodeGateConfig, ReefConfig
from reef.episodes.project import episode_settings, project_server
from reef.episodes.runner import Episode, describe_step, recorded_steps, run_paired
from reef.episodes.tasks import Task, load_suite, task_folder_hash
from reef.episodes.tokens import candidate_tree
from reef.evaluation.runner import TaskResult

CURRENT_TREE = "current"
EPISODE_TASK_PREFIX = "episode:"


def judge_by_episodes(
    gate: EpisodeGateConfig,
    config: ReefConfig,
    scenario: str,
    candidate_id: str,
    on_episode: Callable[[Episode], None] | None = None,
) -> list[TaskResult]:
    """Run the suite on both trees against the project's running server, and answer one task
    result per task."""
    server = project_server(config)
    tasks = load_suite(gate.tasks)
    pairs = run_paired(
        tasks,
        gate.agent,
        server.url,
        {CURRENT_TREE: scenario, candidate_tree(candidate_id): scenario},
        repeats=gate.repeats,
        seed=gate.seed,
        on_episode=on_episode,
        token=server.token,
        signing_token=server.signing_token,
        settings=episode_settings(config.episodes),
    )
    return task_results(tasks, pairs)


def task_results(tasks: list[Task], pairs: list[tuple[Episode, Episode]]) -> list[TaskResult]:
    """One result per task from its (current, candidate) pairs: each side's mean reward, an
    episode that could not be scored counting 0, and what each side did, for a reviewer."""
    results = []
    for task in tasks:
        mine = [pair for pair in pairs if pair[0].task == task.name]
        if not mine:
            continue
        current = [first for first, _ in mine]
        candidate = [second for _, second in mine]
        results.append(
            TaskResult(
                task_id=f"{EPISODE_TASK_PREFIX}{task.name}",
                current_score=_mean_reward(current),
                candidate_score=_mean_reward(candidate),
                current_answer=_what_happened(current),
                candidate_answer=_what_happened(candidate),
                group=task.group,
                prompt=task.instruction.strip(),
                task_hash=task_folder_hash(task),
            )
        )
    return results


def _mean_reward(episodes: list[Episode]) -> float:
    return statistics.fmean(min(1.0, max(0.0, e.reward or 0.0)) for e in episodes)


def _what_happened(episodes: list[Episode]) -> str:
    """Each episode, for a reviewer (`reef review` shows both trees' side by side): its outcome,
    the steps the server recorded of its calls, what the agent's trajectory claims, and the end
    of its test's output. The agent writes its trajectory itself: it is shown as its account,
    after what the server saw."""
    lines = []
    for episode in episodes:
        outcome = "pass" if episode.passed else (episode.limit and f"limit: {episode.limit}")
        outcome = outcome or (f"error: {episode.error}" if episode.error else "fail")
        recorded = "; ".join(describe_step(step) for step in recorded_steps(episode.calls))
        claimed = "; ".join(describe_step(step) for step in episode.commands)
        test = " ".join(episode.test_output.split())[-200:]
        lines.append(
            f"{episode.id} reward={episode.reward} {outcome}, {len(episode.calls)} call(s) | "
            f"recorded: {recorded[:400] or '-'} | the agent's account: {claimed[:200] or '-'} | "
            f"test: {test}"
        )
    return "\n".join(lines)
