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


def kept_teachers(work: Path) -> dict[str, dict]:
    import torch

    folder = work / "teachers" / "default"
    return {
        path.stem: torch.load(path, weights_only=True)
        for path in sorted(folder.glob("*.pt"))
        if not path.stem.startswith("training-")
    }


def test_the_ema_teacher_persists_across_steps_beside_the_adapter_it_taught(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    """The EMA teacher used to restart at the serving adapter each proposal; now the next step
    that continues an adapter continues its teacher, and `initial` never moves it."""
    import torch

    from reef.artifacts import ADAPTER, files_of

    served(store, "Name a fish.", "Cod.", feedback={"demonstration": "Sure! A trout."})
    served(store, "Name a bird.", "Robin.", feedback="start with Sure!")
    settings = {"batch_size": 2, "steps": 2, "learning_rate": 0.002, "max_length": 128}
    for kind in ("ema", "initial"):
        recipe = load_recipe("sdft", {**settings, "teacher": kind, "teacher_update_rate": 0.5})
        work = tmp_path / kind
        context = step_context(tiny_model, work, Engine())
        batch = recipe.build_batch(view(store))
        first = recipe.propose(batch, context)
        assert first is not None
        ((first_key, after_first),) = kept_teachers(work).items()  # beside the first adapter
        context.files = files_of(first.files, ADAPTER)  # the first candidate serves now
        second = recipe.propose(batch, context)
        assert second is not None
        teachers = kept_teachers(work)
        assert len(teachers) == 2  # one beside each adapter
        after_second = next(t for key, t in teachers.items() if key != first_key)
        moved = any(not torch.equal(after_first[name], after_second[name]) for name in after_first)
        # ema: the second step continued the first's teacher and moved it on; initial: the
        # weights the first step started from, unchanged.
        assert moved == (kind == "ema")
    frozen = load_recipe("sdft", {**settings, "teacher": "frozen_release"})
    context = step_context(tiny_model, tmp_path / "frozen", Engine())
    assert frozen.propose(frozen.build_batch(view(store)), context) is not None
    assert not (tmp_path / "frozen" / "teachers").exists()  # each step's teacher anew
