"""Each learning scenario's recipes, loaded and checked before anything starts.

`ReefConfig.learning_plans()` says which scenarios learn with which recipes and mode (the
`learning` default, or a scenario's own `scenarios.<name>.learning`); `load_plans` turns each
into recipe instances, refusing a bad one with the scenario and the key named: an unknown
recipe, a setting the recipe does not have, a recipe that trains weights on the upstream engine
(whose weights are remote).
"""

from __future__ import annotations

from dataclasses import dataclass

from reef.config import LearningPlan, ReefConfig
from reef.engines import resolve_kind
from reef.sdk.recipe import Recipe, RecipeError, load_recipe, recipe_class


@dataclass
class LoadedPlan:
    scenario: str
    mode: str
    recipes: list[Recipe]


def load_plans(config: ReefConfig) -> list[LoadedPlan]:
    """Every learning scenario with its recipes loaded (RecipeError naming the key if one is
    bad). Two scenarios never share a recipe instance: each keeps its own state."""
    engine, _ = resolve_kind(config.engine)
    processes = config.training.processes
    return [
        LoadedPlan(plan.scenario, plan.mode, _recipes(plan, engine, processes))
        for plan in config.learning_plans()
    ]


def _recipes(plan: LearningPlan, engine: str, processes: int) -> list[Recipe]:
    loaded = []
    for index, choice in enumerate(plan.recipes):
        where = f"{plan.key}.recipes[{index}]" if len(plan.recipes) > 1 else plan.key
        try:
            settings = choice.settings()
            if "processes" in recipe_class(choice.recipe).Settings.model_fields:
                settings.setdefault("processes", processes)  # `training.processes`, unless set
            recipe = load_recipe(choice.recipe, settings)
        except RecipeError as error:
            raise RecipeError(f"{where} (scenario {plan.scenario}): {error.message}") from None
        if recipe.trains_weights and engine == "upstream":
            raise RecipeError(
                f"{where} (scenario {plan.scenario}): {recipe.name} trains the served model's "
                "weights, and the upstream engine's weights are remote: use llamacpp or vllm, or "
                "a harness recipe (harness_evolve)"
            )
        loaded.append(recipe)
    return loaded
