"""What the recipes that search over harness trees share (`gepa`, `meta_harness`): a batch of
scored turns, their prompts as tasks scored by the recipe's `scorer`, and a tree's answer to one
of them on the served model, scored as the gate scores it."""

from __future__ import annotations

from pydantic import Field

from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.model import answer_text
from reef.learning.recipe import Recipe, RecipeError, RecipeSettings, StepContext
from reef.learning.view import ExperienceView, Trajectory, Turn


class PromptSearchSettings(RecipeSettings):
    batch_size: int = 6  # scored turns a step learns from (at least one below `threshold`)
    threshold: float = 0.5  # a turn scoring below it is a failure
    scorer: ScorerSpec | None = None  # required: what every tree's answers are scored with
    max_tokens: int = Field(128, ge=1)  # per answer scored
    seed: int = 0  # of every answer scored (at temperature 0)


def has_score(turn: Turn) -> bool:
    return turn.score is not None


class PromptSearch(Recipe):
    """A recipe that scores harness trees on its batch's prompts; subclasses search."""

    signal = "scores on the scenario's scorer, with feedback text"
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

    def tasks(self, turns: list[Turn], context: StepContext) -> list[EvalTask]:
        """The turns' prompts as tasks, once the step has what a search needs."""
        scorer = self.settings.scorer
        if scorer is None:
            raise RecipeError(
                f"{self.name} needs `scorer`: what every tree's answers are scored with"
            )
        if context.generate_under is None or context.ask is None:
            raise RecipeError(
                f"{self.name} needs the served model and a proposer: the worker gives both"
            )
        return [
            EvalTask(id=f"{self.name}:{number}", messages=turn.messages, scorer=scorer)
            for number, turn in enumerate(turns)
        ]

    def answer(
        self, context: StepContext, tree: dict[str, bytes], task: EvalTask
    ) -> tuple[str, float]:
        """`tree`'s answer to `task` on the served model (not recorded), and its score."""
        assert context.generate_under is not None
        body = {
            "messages": task.messages,
            "temperature": 0.0,
            "seed": self.settings.seed,
            "max_tokens": self.settings.max_tokens,
        }
        answer = answer_text(context.generate_under(tree, body))
        return answer, score(task.scorer, answer, task)
