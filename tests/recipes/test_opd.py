"""opd on a real experience store and the tiny random model: any answer with recorded tokens is a
sample, a checkpoint folder is the frozen teacher, and one step lowers the student's log-ratio
to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.recipes.opd.recipe import OPD, OPDSettings
from reef.sdk.recipe import ProposalRefused, RecipeError, load_recipe
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore
from reef.testing.tiny import tiny_model_folder
from tests.support.distillation import (
    Engine,
    served,
    step_context,
    store,
    tiny_model,
)
from tests.support.training import one_thread

__all__ = ["one_thread", "store", "tiny_model"]  # shared fixtures, used by name


def view(store: ExperienceStore) -> ExperienceView:
    return ExperienceView(store, "default", consumed=set())


def test_every_answer_with_its_tokens_is_a_sample(store: ExperienceStore) -> None:
    recipe = OPD(OPDSettings(batch_size=2, teacher="base"))
    served(store, "Name a fish.", "Cod.")
    assert not recipe.ready(view(store))
    served(store, "Name a bird.", "Robin.", score=0.0)
    assert recipe.ready(view(store))
    assert len(recipe.build_batch(view(store))) == 2


def test_a_step_pulls_the_student_toward_a_frozen_checkpoint(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    teacher = tiny_model_folder(tmp_path / "teacher", seed=1)  # same vocabulary, other weights
    records = [served(store, "Name a fish.", "Cod."), served(store, "Name a bird.", "Robin.")]
    recipe = OPD(OPDSettings(teacher=str(teacher), steps=4, learning_rate=0.003, max_length=128))
    context = step_context(tiny_model, tmp_path / "work", Engine())
    proposal = recipe.propose(recipe.build_batch(view(store)), context)
    assert proposal is not None and proposal.kind == "lora"
    assert sorted(proposal.consumed_record_ids) == sorted(records)
    losses = proposal.metrics["loss"]  # the mean log-ratio log p_student - log p_teacher
    assert len(losses) == 4 and losses[-1] < losses[0]
    # With the base as the teacher a fresh adapter is the teacher: nothing to learn, and no
    # candidate (issue 76: it proposed one at loss 0, gradient 0).
    with pytest.raises(ProposalRefused, match="teaches a fresh adapter nothing"):
        OPD(OPDSettings(teacher="base", steps=2, max_length=128)).propose(
            recipe.build_batch(view(store)), context
        )


def test_a_teacher_of_another_vocabulary_is_refused(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    teacher = tiny_model_folder(tmp_path / "teacher", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(teacher)
    served(store, "Name a fish.", "Cod.")
    recipe = OPD(OPDSettings(batch_size=1, teacher=str(teacher), steps=1, max_length=128))
    context = step_context(tiny_model, tmp_path / "work", Engine())
    with pytest.raises(RecipeError, match="another vocabulary"):
        recipe.propose(recipe.build_batch(view(store)), context)


def test_without_a_teacher_opd_refuses_to_start_saying_how_to_set_one() -> None:
    with pytest.raises(RecipeError, match=r"opd needs `teacher`: the path of a checkpoint"):
        load_recipe("opd", {})
    assert load_recipe("opd", {"teacher": "base"}).settings.teacher == "base"  # type: ignore[attr-defined]
