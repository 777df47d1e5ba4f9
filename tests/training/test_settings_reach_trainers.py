"""A recipe's settings reach its trainer by name (`policy_update`, `DistillSettings.shared_with`,
issue 77: "a renamed field silently stops reaching the trainer"). Which names each recipe hands
its trainer is written here: a field renamed on either side changes the set, and this test
says which name stopped reaching (or began to)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from reef.recipes.opd.recipe import OPDSettings
from reef.recipes.openclaw_rl.recipe import OpenClawRLSettings
from reef.recipes.sdft.recipe import SDFTSettings
from reef.recipes.sdpo.recipe import SDPOSettings
from reef.recipes.sft.recipe import SFTSettings
from reef.recipes.tttd.recipe import TTTDSettings
from reef.sdk.recipe import RecipeSettings
from reef.sdk.weights import LoraRecipeSettings
from reef.training import DistillSettings, LoraSettings, PolicySettings

LORA_RUN = {"alpha", "learning_rate", "processes", "rank", "seed", "steps", "target_modules"}
LORA_RUN |= {"threads"}
DISTILL = {"divergence", "jsd_beta", "skip_tokens", "teacher", "teacher_update_rate", "tis_cap"}
DISTILL |= {"top_k"}
# (recipe settings, trainer settings, what the recipe's batch and length mean there: handed over
# explicitly, not by name) -> the names that reach the trainer.
REACHES = {
    (TTTDSettings, PolicySettings): LORA_RUN | {"kl_beta", "max_length"},
    (OpenClawRLSettings, PolicySettings): LORA_RUN
    | {"clip_high", "clip_low", "kl_beta", "max_length", "tis_cap"},
    (SFTSettings, DistillSettings): LORA_RUN,
    (SDFTSettings, DistillSettings): LORA_RUN | DISTILL,
    (SDPOSettings, DistillSettings): LORA_RUN | DISTILL,
    (OPDSettings, DistillSettings): LORA_RUN | {"skip_tokens", "teacher", "tis_cap"},
}
NOT_BY_NAME = {"batch_size", "max_length"}  # handed to the distiller explicitly


def shared(recipe: type[BaseModel], trainer: type[BaseModel]) -> set[str]:
    names = set(trainer.model_fields) & set(recipe.model_fields)
    names -= set(RecipeSettings.model_fields)  # the recipe's batch is not the trainer's
    if trainer is DistillSettings:
        names -= NOT_BY_NAME
    return names


@pytest.mark.parametrize(("recipe", "trainer"), list(REACHES))
def test_each_recipe_hands_its_trainer_the_settings_it_means_to(
    recipe: type[BaseModel], trainer: type[BaseModel]
) -> None:
    found = shared(recipe, trainer)
    expected = REACHES[(recipe, trainer)]
    assert found == expected, (
        f"{recipe.__name__} -> {trainer.__name__}: no longer reaching {sorted(expected - found)}, "
        f"now reaching {sorted(found - expected)}"
    )


def test_every_lora_run_setting_is_one_the_trainer_has() -> None:
    """The LoRA run a weight recipe declares (`LoraRecipeSettings`) is the trainer's, but what
    only a recipe decides: a renamed trainer field would leave the recipe's setting unread."""
    recipe_only = {"checkpoint"} | set(RecipeSettings.model_fields)
    assert set(LoraRecipeSettings.model_fields) - recipe_only <= set(LoraSettings.model_fields)
