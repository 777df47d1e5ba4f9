"""What the recipes that search over harness trees share (`gepa`, `meta_harness`, `skills`): the
tasks a step scores trees on, and a tree's outcome on one of them.

A task is, by default, one of the batch's scored turns: its prompt, answered by the served model
under the tree and scored by the recipe's `scorer` as the gate scores it, with what the user
said about it. With `episodes` set, the tasks are a suite of Harbor tasks instead: the agent runs
each under the tree in the sandbox (`StepContext.run_episodes_under`), and the tree is scored by
what the agent did (the test's reward), with the agent's commands and the test's output as the
trace a proposer reads.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reef.episodes.runner import describe_step
from reef.episodes.tasks import BadTask, Task, load_suite, task_folder_hash
from reef.evaluation.scorers import ProgramScorer, score
from reef.evaluation.tasks import EvalTask
from reef.inference.model import answer_text
from reef.sdk.feedback import hints
from reef.sdk.recipe import (
    Recipe,
    RecipeError,
    RecipeSettings,
    StepContext,
)
from reef.sdk.view import ExperienceView, Trajectory, Turn

# How much of an episode a proposer reads: the agent's steps and the end of the test's output.
EPISODE_TRACE_CHARS = 600


NO_TASKS = (
    "episodes needs `tasks`, a folder of Harbor tasks of its own: the gate's suite "
    "(gate.episodes.tasks) judges what the search finds, and a search on it would be judged on "
    "the tasks it was fitted to"
)


class EpisodeSearch(BaseModel):
    """`episodes:` in a search recipe's settings: score trees by running the agent on tasks."""

    model_config = ConfigDict(extra="forbid")

    # A folder of Harbor tasks, or one task (relative: to the config's folder), none of which
    # the gate's episodes judge on (`gate.episodes.tasks`): the search's own.
    tasks: Path | None = None
    agent: str = "native"  # native, pi, codex, claude, opencode
    repeats: int = Field(1, ge=1)  # episodes per task and tree (each one metric call)

    @model_validator(mode="after")
    def _own_tasks(self) -> EpisodeSearch:
        if self.tasks is None:
            raise ValueError(NO_TASKS)
        return self


class PromptSearchSettings(RecipeSettings):
    batch_size: int = 6  # scored turns a step learns from (at least one below `threshold`)
    threshold: float = 0.5  # a turn scoring below it is a failure
    scorer: ProgramScorer | None = None  # what every tree's answers are scored with (chat tasks)
    max_tokens: int = Field(128, ge=1)  # per answer scored
    seed: int = 0  # of every answer scored (at temperature 0)
    episodes: EpisodeSearch | None = None  # score trees on episodes instead of chat answers


@dataclass(frozen=True)
class SearchTask:
    """One task a search scores trees on: a scored turn's prompt (`chat`) or a Harbor task
    (`episode`), with what was said about it (the user's feedback; for an episode, the trace
    of each run says it)."""

    prompt: str
    said: str
    chat: EvalTask | None = None
    episode: Task | None = None


def has_score(turn: Turn) -> bool:
    return turn.score is not None


class PromptSearch(Recipe):
    """A recipe that scores harness trees on tasks; subclasses search."""

    signal = "scores on the scenario's scorer, with feedback text; or episodes' rewards"
    target = "harness"
    Settings = PromptSearchSettings
    settings: PromptSearchSettings

    def failing(self, turn: Turn) -> bool:
        return (turn.score or 0.0) < self.settings.threshold

    def ready(self, view: ExperienceView) -> bool:
        enough = view.holds(has_score, self.settings.batch_size)
        return enough and any(has_score(turn) and self.failing(turn) for turn in view.turns())

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return view.batch_of(has_score, self.settings.batch_size)

    def scored_turns(self, batch: list[Trajectory]) -> list[Turn]:
        return [turn for trajectory in batch for turn in trajectory.turns if has_score(turn)]

    def search_tasks(self, turns: list[Turn], context: StepContext) -> list[SearchTask]:
        """What the step scores trees on: the turns' prompts, or the episode suite."""
        if context.ask is None:
            raise RecipeError(f"{self.name} needs a proposer model: the worker gives one")
        if self.settings.episodes is not None:
            return self._episode_tasks(self.settings.episodes, context)
        scorer = self.settings.scorer
        if scorer is None:
            raise RecipeError(
                f"{self.name} needs `scorer`: what every tree's answers are scored with "
                "(or `episodes`, to score trees by running the agent on tasks)"
            )
        if context.generate_under is None:
            raise RecipeError(f"{self.name} needs the served model: the worker gives it")
        return [
            SearchTask(
                prompt=turn.prompt,
                said="; ".join(hints(turn)) or "nothing",
                chat=EvalTask(id=f"{self.name}:{number}", messages=turn.messages, scorer=scorer),
            )
            for number, turn in enumerate(turns)
        ]

    def _episode_tasks(self, episodes: EpisodeSearch, context: StepContext) -> list[SearchTask]:
        if episodes.tasks is None:  # refused at load: a settings object made in code
            raise RecipeError(f"{self.name}: {NO_TASKS}")
        if context.run_episodes_under is None:
            raise RecipeError(f"{self.name}: episodes need the running server and the worker")
        try:
            tasks = load_suite(episodes.tasks)
            judged = load_suite(context.episode_suite) if context.episode_suite else []
        except BadTask as error:
            raise RecipeError(f"{self.name}: episodes.tasks: {error}") from None
        _refuse_the_gate_s_tasks(self.name, tasks, judged)
        said = "the task's test checks the result (its output follows each run)"
        return [SearchTask(task.instruction.strip(), said, episode=task) for task in tasks]

    def held_out_tasks(self, turns: list[Turn]) -> list[EvalTask]:
        """The held-out calls the gate judges on, on chat tasks (an episode search leaves
        judging to the scenario's gate, whose episodes it names)."""
        if self.settings.episodes is not None:
            return []
        return super().held_out_tasks(turns)

    def answer(
        self, context: StepContext, tree: dict[str, bytes], task: SearchTask
    ) -> tuple[str, float]:
        """What `tree` did on `task` (an answer on the served model, not recorded, or its
        episodes' traces) and its score."""
        if task.episode is not None:
            return self._episodes_under(context, tree, task.episode)
        assert context.generate_under is not None and task.chat is not None
        body = {
            "messages": task.chat.messages,
            "temperature": 0.0,
            "seed": self.settings.seed,
            "max_tokens": self.settings.max_tokens,
        }
        answer = answer_text(context.generate_under(tree, body))
        return answer, score(task.chat.scorer, answer, task.chat)

    def _episodes_under(
        self, context: StepContext, tree: dict[str, bytes], task: Task
    ) -> tuple[str, float]:
        assert context.run_episodes_under is not None and self.settings.episodes is not None
        episodes = self.settings.episodes
        ran = context.run_episodes_under(
            tree, task.path, agent=episodes.agent, repeats=episodes.repeats
        )
        rewards = [min(1.0, max(0.0, episode.get("reward") or 0.0)) for episode in ran]
        return "\n".join(map(episode_trace, ran)), statistics.fmean(rewards) if rewards else 0.0


def episode_trace(episode: dict[str, Any]) -> str:
    """An episode as a proposer reads it: its outcome, the agent's steps, the test's verdict."""
    outcome = "passed" if episode.get("passed") else "failed"
    if episode.get("limit"):
        outcome += f" (stopped: {episode['limit']})"
    elif episode.get("error"):
        outcome += f" ({episode['error']})"
    steps = "; ".join(describe_step(step)[:160] for step in episode.get("commands") or [])
    test = " ".join(str(episode.get("test_output") or "").split())
    trace = f"{outcome}. The agent did: {steps or 'nothing'}. The test said: {test[-200:]}"
    return trace[:EPISODE_TRACE_CHARS]


def _refuse_the_gate_s_tasks(recipe: str, searched: list[Task], judged: list[Task]) -> None:
    """A search never runs on a task the gate judges on: the same content (instruction, files,
    test), wherever it lies, is refused by name."""
    gate = {task_folder_hash(task): task.name for task in judged}
    shared = [task.name for task in searched if task_folder_hash(task) in gate]
    if shared:
        raise RecipeError(
            f"{recipe}: episodes.tasks holds task(s) the gate judges on ({', '.join(shared)}): "
            "a search fitted to the gate's tasks would be judged on them; give it a suite of "
            "other tasks"
        )
