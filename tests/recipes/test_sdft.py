"""sdft on a real experience store and the tiny random model: which turns it waits for, what the
teacher reads, and one step that distils a LoRA and proposes it."""

from __future__ import annotations

from pathlib import Path

from reef.recipes.sdft.recipe import SDFT, SDFTSettings
from reef.sdk.recipe import load_recipe
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore
from tests.support.distillation import (
    Engine,
    answer_ids,
    render,
    served,
    step_context,
    store,
    tiny_model,
)
from tests.support.training import one_thread

__all__ = ["one_thread", "store", "tiny_model"]  # shared fixtures, used by name


def view(store: ExperienceStore) -> ExperienceView:
    return ExperienceView(store, "default", consumed=set())


def test_sdft_waits_for_answers_with_a_demonstration_or_a_hint(store: ExperienceStore) -> None:
    recipe = SDFT(SDFTSettings(batch_size=2))
    served(store, "Name a colour.", "Blue.", score=1.0)  # a score alone teaches nothing here
    served(store, "Name a fish.", "Cod.", feedback={"demonstration": "Sure! A trout."})
    assert not recipe.ready(view(store))
    served(store, "Name a bird.", "Robin.", feedback="start with Sure!")
    assert recipe.ready(view(store))
    assert not SDFT(SDFTSettings(batch_size=2, use_hints=False)).ready(view(store))
    batch = recipe.build_batch(view(store))
    assert [t.turns[0].prompt for t in batch] == ["Name a fish.", "Name a bird."]
    # Without the answer's tokens there is nothing of the student's own to score.
    served(store, "Name a tree.", "Oak.", feedback={"demonstration": "Sure! An oak."})
    turn = next(t for t in view(store).turns() if t.prompt == "Name a tree.")
    turn.completion_token_ids = None
    assert not recipe.learnable(turn)


def test_a_step_distils_the_demonstration_reading_model_on_the_served_answer(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    fish = served(store, "Name a fish.", "Cod.", feedback={"demonstration": "Sure! A trout."})
    bird = served(store, "Name a bird.", "Robin.", feedback="start with Sure!")
    recipe = load_recipe(
        "reef.recipes.sdft.recipe:SDFT",
        # tis_cap none: the loss is then the KL alone, and falls step by step
        {"batch_size": 2, "steps": 4, "learning_rate": 0.002, "max_length": 128, "tis_cap": None},
    )
    assert isinstance(recipe, SDFT)
    batch = recipe.build_batch(view(store))
    engine = Engine()
    context = step_context(tiny_model, tmp_path / "work", engine)
    examples = recipe.examples([t for b in batch for t in b.turns], context)
    # The student reads the prompt as served; the teacher the demonstration (or the hint)
    # after the user's message; both score the answer the model gave.
    assert [e.student_prompt_ids for e in examples] == [
        render([{"role": "user", "content": "Name a fish."}]),
        render([{"role": "user", "content": "Name a bird."}]),
    ]
    demonstrated, hinted = (messages[-1]["content"] for messages in engine.asked)
    assert demonstrated.startswith("Name a fish. ") and "Sure! A trout." in demonstrated
    assert hinted == "Name a bird. start with Sure!"
    assert examples[0].teacher_prompt_ids == render(engine.asked[0])
    assert [e.completion_ids for e in examples] == [answer_ids("Cod."), answer_ids("Robin.")]
    assert examples[0].behaviour_logprobs == [-1.0] * len(answer_ids("Cod."))

    proposal = recipe.propose(batch, context)
    assert proposal is not None and proposal.kind == "lora"
    assert {"adapter.gguf", "peft/adapter_config.json"} <= set(proposal.files)
    assert sorted(proposal.consumed_record_ids) == sorted([fish, bird])
    losses = proposal.metrics["loss"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert proposal.metrics["examples"] == 2 and "SDFT (forward KL" in proposal.reason
