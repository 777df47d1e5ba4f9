"""The recipe contract: how experience becomes candidates.

A recipe is a Python class named in the config (`learning.recipe: package.module:Class`, or a
built-in short name). It sees experience only through an `ExperienceView` and returns a
`Proposal`; it never touches HTTP, git or SQL itself. The worker turns the proposal into a
candidate, runs the gate, and records what it consumed.

    class MyRecipe(Recipe):
        name = "my_recipe"
        signal = "scores below 0.5"
        experience = "reactive, from live traffic"
        target = "harness"

        class Settings(RecipeSettings):
            threshold: float = 0.5

        def ready(self, view): ...
        def build_batch(self, view): ...
        def propose(self, batch, context): ...
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.errors import ReefError, describe_validation_error
from reef.evaluation.tasks import EvalTask
from reef.learning.experience import ExperienceView, Trajectory

BUILTIN_RECIPES = {
    "harness_evolve": "recipes.harness_evolve.recipe:HarnessEvolve",
}


class RecipeError(ReefError):
    status = 400
    code = "bad_recipe"


class ProposalRefused(Exception):
    """A recipe's proposer produced nothing usable this step (garbage, or no change): the step
    ends with no candidate and this message in the log and the status, never with a crash."""


class RecipeSettings(BaseModel):
    """Settings every recipe has; a recipe's own `Settings` subclass adds its keys."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(4, ge=1)
    # Skip records served more than this many releases before the head (None: keep all).
    max_staleness: int | None = Field(None, ge=0)


@dataclass
class Evaluated:
    """An earlier candidate of the scenario: its files and its gate score on each task."""

    candidate_id: str
    files: dict[str, bytes]
    scores: dict[str, float]


@dataclass
class StepContext:
    """What a recipe may know besides the batch when it proposes."""

    scenario: str
    release_id: str
    files: dict[str, bytes]  # the current release's artifact (empty for base)
    recent_rejections: list[str] = field(default_factory=list)  # reasons, newest first
    instruction: str | None = None  # from `reef train "…"` in manual or hybrid mode
    # Sends chat messages to the proposer model (learning.proposer_*; default: the served
    # model) and returns its reply: recipes reach models through this, never HTTP directly.
    ask: Callable[[list[dict[str, str]]], str] | None = None
    # Earlier candidates with their per-task scores, newest first (for population-based recipes).
    evaluated: list[Evaluated] = field(default_factory=list)


@dataclass
class Proposal:
    kind: str
    files: dict[str, bytes]
    reason: str
    consumed_record_ids: list[str]
    eval_tasks: list[EvalTask] = field(default_factory=list)  # run by the gate beside evals/


class Recipe:
    name: ClassVar[str] = "recipe"
    signal: ClassVar[str] = ""
    experience: ClassVar[str] = ""
    target: ClassVar[str] = ""
    Settings: ClassVar[type[RecipeSettings]] = RecipeSettings

    def __init__(self, settings: RecipeSettings) -> None:
        self.settings = settings

    def ready(self, view: ExperienceView) -> bool:
        """True when a batch is worth a step (auto mode asks this every interval)."""
        return len(view.trajectories) >= self.settings.batch_size

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return view.trajectories[: self.settings.batch_size]

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        """A candidate artifact built from the batch, or None to propose nothing this step
        (raise ProposalRefused to say why)."""
        raise NotImplementedError


def recipe_class(reference: str) -> type[Recipe]:
    """The class named by `module:Class` or a built-in short name, with errors that say why."""
    target = BUILTIN_RECIPES.get(reference, reference)
    module_name, _, class_name = target.partition(":")
    # A project's own recipes/ (from `reef recipe new`) imports from the folder Reef runs in;
    # `recipes` is a namespace package, so they sit beside the built-in ones.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    if not class_name:
        known = ", ".join(BUILTIN_RECIPES)
        raise RecipeError(
            f"recipe {reference!r} is neither a built-in ({known}) nor 'package.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise RecipeError(f"cannot import recipe module {module_name!r}: {error}") from None
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Recipe)):
        raise RecipeError(f"{target} is not a Recipe subclass (reef.learning.recipe.Recipe)")
    return found


def load_recipe(reference: str, settings: dict[str, Any]) -> Recipe:
    cls = recipe_class(reference)
    try:
        parsed = cls.Settings.model_validate(settings)
    except ValidationError as error:
        raise RecipeError(
            f"learning settings for {cls.name}: {describe_validation_error(error)}"
        ) from None
    return cls(parsed)
