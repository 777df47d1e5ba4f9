"""sft's hint examples: a failing turn with plain feedback that no hindsight answer meets is
distilled from the model that reads the feedback, on the answer as served. On a real experience
store and the tiny random model, whose engine (scripted) never finishes an answer, so that no
relabel is kept and nothing is replayed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reef.recipes.sft.recipe import SFT, SFTSettings
from reef.sdk.hindsight import with_hint
from reef.sdk.recipe import ProposalRefused, load_recipe
from reef.sdk.view import ExperienceView, Turn
from reef.store import ExperienceStore, Record, Report
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

FISH = [{"role": "user", "content": "Name a fish."}]
HINT = "start with Sure!"
# A short run that moves the tiny model (the engine reports no log-probs to weigh by).
FAST = {"steps": 12, "learning_rate": 0.003, "max_length": 128, "hint_tis_cap": None}


def view(store: ExperienceStore) -> ExperienceView:
    return ExperienceView(store, "default", consumed=set())


def turns(store: ExperienceStore) -> list[Turn]:
    return list(view(store).turns())


def sft(**settings: object) -> SFT:
    recipe = load_recipe("reef.recipes.sft.recipe:SFT", {"batch_size": 1, **FAST, **settings})
    assert isinstance(recipe, SFT)
    return recipe


def first_token_probabilities(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    return F.softmax(logits.float(), dim=-1)


def adapter_model(files: dict[str, bytes], base: object, folder: Path) -> torch.nn.Module:
    from reef.training.adapter import load_lora

    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return load_lora(base, folder).eval()  # type: ignore[arg-type]


def test_a_failing_turn_with_plain_feedback_becomes_a_hint_example(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "Name a fish.", "Cod.", score=0.0, feedback=HINT)
    served(store, "Name a bird.", "Robin.", feedback="say Sure first")  # unscored, with words
    recipe = sft()
    engine = Engine()
    context = step_context(tiny_model, tmp_path / "work", engine)
    hinted = recipe._hinted(turns(store), pairs=[])
    examples = recipe._hint_examples(hinted, context, {})
    # The student reads the prompt as served; the teacher the same messages with the feedback
    # after the user's message, as the engine renders them; both score the served answer.
    assert [e.student_prompt_ids for e in examples] == [
        render(FISH),
        render([{"role": "user", "content": "Name a bird."}]),
    ]
    assert [m[-1]["content"] for m in engine.asked] == [
        "Name a fish. start with Sure!",
        "Name a bird. say Sure first",
    ]
    assert examples[0].teacher_prompt_ids == render(with_hint(FISH, HINT))
    assert [e.completion_ids for e in examples] == [answer_ids("Cod."), answer_ids("Robin.")]
    assert examples[0].behaviour_logprobs == [-1.0] * len(answer_ids("Cod."))
    assert [e.weight for e in sft(hint_weight=0.5)._hint_examples(hinted, context, {})] == [0.5] * 2
    # A turn that a relabel (or a demonstration) already teaches is not distilled as well.
    pairs: list[tuple[Turn, list[int] | str]] = [(hinted[0], "Sure! Cod.")]
    assert recipe._hinted(hinted, pairs) == [hinted[1]]
    assert sft(hint_distillation=False)._hinted(hinted, []) == []


def test_a_low_score_whose_conversation_went_on_takes_the_next_message_as_feedback() -> None:
    def turn(score: float | None) -> Turn:
        reports = [] if score is None else [{"score": score}]
        return Turn(
            "r1",
            FISH,
            {"role": "assistant", "content": "Cod."},
            "base",
            reports=reports,
            next_state=[{"role": "user", "content": "no, start with Sure"}],
            completion_token_ids=answer_ids("Cod."),
        )

    recipe = SFT(SFTSettings())
    assert recipe.failing_with_hint(turn(0.0))
    assert recipe._hinted([turn(0.0)], []) == [turn(0.0)]
    # Unscored, a next message is just the conversation going on; scored well, a good answer.
    assert not recipe.learnable(turn(None))
    assert not recipe.failing_with_hint(turn(1.0)) and recipe.good(turn(1.0))


def test_plain_feedback_alone_proposes_a_candidate_of_hint_examples_that_moves_the_student(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    recipe = sft()
    engine = Engine()
    context = step_context(tiny_model, tmp_path / "work", engine)
    base = recipe.base(context)
    student_prompt, teacher_prompt = render(FISH), render(with_hint(FISH, HINT))
    before = first_token_probabilities(base.model, student_prompt)
    teacher = first_token_probabilities(base.model, teacher_prompt)
    # X: the token the feedback in context raises the most as the answer's first token.
    raised = int(torch.argmax(teacher.log() - before.log()))
    assert teacher[raised] > 10 * before[raised]
    # The answer as served, two tokens, not X: what the student learns is the teacher's
    # distribution at each served token, not the served tokens themselves.
    other = int(torch.argmax(before))
    assert other != raised
    eos = int(base.tokenizer.eos_token_id)
    record = Record(
        scenario="default",
        request={"messages": FISH},
        response={"choices": [{"message": {"role": "assistant", "content": "?"}}]},
        engine="test",
        release_id="base",
        prompt_token_ids=student_prompt,
        completion_token_ids=[other, eos],
    )
    fish = store.add_record(record).result()
    store.add_report(Report("default", [fish], score=0.0, feedback=HINT)).result()
    assert recipe.ready(view(store))

    proposal = recipe.propose(recipe.build_batch(view(store)), context)
    assert proposal is not None and proposal.kind == "lora"
    assert proposal.consumed_record_ids == [fish]
    metrics = proposal.metrics
    assert metrics["examples"] == metrics["hint_examples"] == 1
    assert metrics["supervised"] == 0 and metrics["replayed"] == 0
    assert "sft_loss" not in metrics and len(metrics["hint_loss"]) == 12
    assert metrics["loss"] == metrics["hint_loss"] and metrics["loss"][-1] < metrics["loss"][0]
    assert "1 hint example(s)" in proposal.reason

    trained = adapter_model(proposal.files, base, tmp_path / "candidate")
    after = first_token_probabilities(trained, student_prompt)
    # Without the feedback, the candidate gives X more of the probability the feedback gave it.
    assert 10 * before[raised] < after[raised] <= teacher[raised] * 1.5
    kl_before = float((teacher * (teacher.log() - before.log())).sum())
    kl_after = float((teacher * (teacher.log() - after.log())).sum())
    assert kl_after < kl_before


def test_good_answers_and_hints_train_in_one_step_supervised_then_distilled(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "Name a colour.", "Blue.", score=1.0)
    served(store, "Name a fish.", "Cod.", score=0.0, feedback=HINT)
    recipe = sft(batch_size=2, hint_steps=5)
    context = step_context(tiny_model, tmp_path / "work", Engine())
    proposal = recipe.propose(recipe.build_batch(view(store)), context)
    assert proposal is not None
    metrics = proposal.metrics
    assert (metrics["supervised"], metrics["hint_examples"], metrics["examples"]) == (1, 1, 2)
    assert len(metrics["sft_loss"]) == 12 and len(metrics["hint_loss"]) == 5
    assert metrics["loss"] == metrics["sft_loss"] + metrics["hint_loss"]


def test_without_feedback_nothing_changes(
    store: ExperienceStore, tiny_model: Path, tmp_path: Path
) -> None:
    served(store, "Name a fish.", "Cod.", score=0.0)  # a low score with no words
    recipe = sft()
    assert not recipe.ready(view(store))
    context = step_context(tiny_model, tmp_path / "work", Engine())
    with pytest.raises(ProposalRefused, match="nothing to train on"):
        recipe.propose(recipe.build_batch(view(store)) or list(view(store).trajectories), context)
    # Good answers alone train as before: the cross-entropy run, no distillation.
    served(store, "Name a colour.", "Blue.", score=1.0)
    proposal = recipe.propose(recipe.build_batch(view(store)), context)
    assert proposal is not None
    metrics = proposal.metrics
    assert (metrics["supervised"], metrics["hint_examples"]) == (1, 0)
    assert "hint_loss" not in metrics and metrics["loss"] == metrics["sft_loss"]
    # And with hint distillation off, plain feedback alone is refused, as before.
    served(store, "Name a bird.", "Robin.", score=0.0, feedback=HINT)
    bird = [t for t in view(store).trajectories if t.turns[0].prompt == "Name a bird."]
    with pytest.raises(ProposalRefused):
        sft(hint_distillation=False).propose(bird, context)
