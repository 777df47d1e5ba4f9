"""sdpo on a real experience store and the tiny random model: which attempts teach which, and one
step that distils a LoRA from the correct siblings."""

from __future__ import annotations

from pathlib import Path

from reef.recipes.sdpo.recipe import SDPO, SDPOSettings
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore
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


def test_each_attempt_reads_the_first_other_correct_attempt_at_its_question(
    store: ExperienceStore,
) -> None:
    recipe = SDPO(SDPOSettings(batch_size=3))
    served(store, "2+2?", "5", score=0.0, seed=1)
    served(store, "2+2?", "4", score=1.0, seed=2)
    served(store, "2+2?", "It is 4.", score=1.0, seed=3)
    served(store, "3+3?", "7", score=0.0, seed=1)  # nothing answered it: no target
    served(store, "2+2?", "four?", seed=4)  # not scored: not an attempt
    paired = {
        t.answer_text: s.answer_text if s else None for t, s in recipe.attempts(view(store).turns())
    }
    assert paired == {"5": "4", "4": "It is 4.", "It is 4.": "4", "7": None}
    assert recipe.ready(view(store))
    assert not SDPO(SDPOSettings(batch_size=4)).ready(view(store))
    own = SDPO(SDPOSettings(allow_own_success=True))
    assert {
        t.answer_text: s.answer_text if s else None for t, s in own.attempts(view(store).turns())
    }["4"] == "4"
    # The whole question, even past batch_size: its correct attempts are the teachers.
    first = SDPO(SDPOSettings(batch_size=1)).build_batch(view(store))
    assert {t.turns[0].answer_text for t in first} == {"5", "4", "It is 4.", "four?"}


def test_a_step_distils_the_correct_siblings_into_the_other_attempts(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "2+2?", "5", score=0.0, seed=1)
    served(store, "2+2?", "4", score=1.0, seed=2)
    served(store, "3+3?", "7", score=0.0, seed=1)
    recipe = SDPO(
        SDPOSettings(batch_size=1, steps=3, learning_rate=0.003, top_k=20, max_length=128)
    )
    batch = recipe.build_batch(view(store)) + [
        t for t in view(store).trajectories if t.turns[0].prompt == "3+3?"
    ]
    engine = Engine()
    context = step_context(tiny_model, tmp_path / "work", engine)
    paired = recipe.attempts([turn for t in batch for turn in t.turns])
    examples = recipe.examples(paired, context)
    weights = {t.answer_text: e.weight for (t, _), e in zip(paired, examples, strict=True)}
    assert weights == {"5": 1.0, "4": 0.0, "7": 0.0}  # "4" has no other correct sibling
    (teacher_reads,) = engine.asked
    assert (
        teacher_reads[-1]["content"].startswith("2+2? ")
        and "\n\n4\n\n" in teacher_reads[-1]["content"]
    )
    wrong = next(e for (t, _), e in zip(paired, examples, strict=True) if t.answer_text == "5")
    assert wrong.teacher_prompt_ids != wrong.student_prompt_ids

    proposal = recipe.propose(batch, context)
    assert proposal is not None and proposal.kind == "lora"
    assert proposal.metrics["attempts"] == 3 and proposal.metrics["taught"] == 1
    losses = proposal.metrics["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0]
