"""The distillation losses against hand computations on a 2-token example (hand-made
distributions, no model), the batch's alignment of the two prompts, the EMA teacher's rate, and
distillation on the tiny random model: the student without the teacher's context comes to give
a token the probability the context gave it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from reef.training import Base
from reef.training.adapter import new_lora
from reef.training.distill import (
    DistillExample,
    DistillSettings,
    EMATeacher,
    distill,
    forward_kl,
    importance_weights,
    jsd,
    make_distill_batch,
    reverse_kl,
    sampled_reverse_kl,
    swapped_in,
    token_losses,
    top_k_with_tail,
    trainable,
)
from reef.training.logprobs import completion_logprobs
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name

LN2, LN3 = math.log(2), math.log(3)
# Two completion positions over a 3-token vocabulary. At the first the teacher moves most of
# the mass to token 2; at the second both agree.
STUDENT = [[1 / 2, 1 / 4, 1 / 4], [1 / 4, 1 / 2, 1 / 4]]
TEACHER = [[1 / 8, 1 / 8, 3 / 4], [1 / 4, 1 / 2, 1 / 4]]


def logs(probabilities: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor([probabilities], dtype=torch.float64))  # (1 row, 2, 3)


def test_forward_kl_is_the_teachers_expectation_of_the_log_ratio() -> None:
    # KL(q || s) = 1/8 ln(1/8 / 1/2) + 1/8 ln(1/8 / 1/4) + 3/4 ln(3/4 / 1/4)
    first = -3 / 8 * LN2 + 3 / 4 * LN3
    assert forward_kl(logs(STUDENT), logs(TEACHER))[0].tolist() == pytest.approx([first, 0.0])


def test_reverse_kl_is_the_students_expectation_of_the_log_ratio() -> None:
    # KL(s || q) = 1/2 ln(1/2 / 1/8) + 1/4 ln(1/4 / 1/8) + 1/4 ln(1/4 / 3/4)
    first = 5 / 4 * LN2 - 1 / 4 * LN3
    assert reverse_kl(logs(STUDENT), logs(TEACHER))[0].tolist() == pytest.approx([first, 0.0])


def test_the_jsd_measures_both_against_their_mixture() -> None:
    # m = (q + s) / 2 = [5/16, 3/16, 1/2]
    to_teacher = 1 / 8 * math.log(2 / 5) + 1 / 8 * math.log(2 / 3) + 3 / 4 * math.log(3 / 2)
    to_student = 1 / 2 * math.log(8 / 5) + 1 / 4 * math.log(4 / 3) + 1 / 4 * math.log(1 / 2)
    symmetric = jsd(logs(STUDENT), logs(TEACHER), beta=0.5)[0]
    assert symmetric.tolist() == pytest.approx([(to_teacher + to_student) / 2, 0.0])
    # beta is the teacher's weight: m = 0.9 q + 0.1 s, and KL(q || m) weighs 0.9.
    m = [0.9 * q + 0.1 * s for q, s in zip(TEACHER[0], STUDENT[0], strict=True)]
    leaning = 0.9 * sum(q * math.log(q / x) for q, x in zip(TEACHER[0], m, strict=True))
    leaning += 0.1 * sum(s * math.log(s / x) for s, x in zip(STUDENT[0], m, strict=True))
    assert jsd(logs(STUDENT), logs(TEACHER), beta=0.9)[0, 0].item() == pytest.approx(leaning)


def test_the_top_k_keeps_the_students_likeliest_tokens_and_one_bucket_for_the_rest() -> None:
    student, teacher = top_k_with_tail(logs(STUDENT), logs(TEACHER), k=1)
    # Position 1: the student's top token is 0 (1/2); the teacher gives it 1/8, the rest 7/8.
    assert student.exp()[0].flatten().tolist() == pytest.approx([1 / 2, 1 / 2, 1 / 2, 1 / 2])
    assert teacher.exp()[0].flatten().tolist() == pytest.approx([1 / 8, 7 / 8, 1 / 2, 1 / 2])
    # The JSD over {token 0, the rest}, m = [5/16, 11/16]; nothing at position 2.
    to_teacher = 1 / 8 * math.log(2 / 5) + 7 / 8 * math.log(14 / 11)
    to_student = 1 / 2 * math.log(8 / 5) + 1 / 2 * math.log(8 / 11)
    settings = DistillSettings(divergence="jsd", top_k=1)
    tokens = torch.tensor([[0, 1]])
    losses, _ = token_losses(logs(STUDENT), logs(TEACHER), tokens, settings)
    assert losses[0].tolist() == pytest.approx([(to_teacher + to_student) / 2, 0.0], abs=1e-6)
    # With k as large as the vocabulary the tail is empty and the divergence is the full one.
    full = DistillSettings(divergence="forward", top_k=3)
    everything, _ = token_losses(logs(STUDENT), logs(TEACHER), tokens, full)
    first = -3 / 8 * LN2 + 3 / 4 * LN3
    assert everything[0].tolist() == pytest.approx([first, 0.0], abs=1e-5)


def test_the_sampled_reverse_kl_is_the_log_ratio_with_the_policy_gradient() -> None:
    # Tokens 0 then 2 were sampled: ln(1/2) - ln(1/8) = 2 ln 2, then ln(1/4) - ln(1/4) = 0.
    student_logits = logs(STUDENT).clone().requires_grad_(True)
    settings = DistillSettings(divergence="sampled_reverse")
    losses, sampled = token_losses(student_logits, logs(TEACHER), torch.tensor([[0, 2]]), settings)
    assert losses[0].tolist() == pytest.approx([2 * LN2, 0.0])
    assert sampled[0].tolist() == pytest.approx([-LN2, -2 * LN2])
    # Its gradient is (log s - log q) * d log s(y): 2 ln 2 * (onehot(0) - s) at position 1.
    losses.sum().backward()
    assert student_logits.grad is not None
    expected = [2 * LN2 * (1 - 1 / 2), 2 * LN2 * -1 / 4, 2 * LN2 * -1 / 4]
    assert student_logits.grad[0, 0].tolist() == pytest.approx(expected)
    assert student_logits.grad[0, 1].tolist() == pytest.approx([0.0, 0.0, 0.0])
    direct = sampled_reverse_kl(torch.tensor([-LN2]), torch.tensor([-3 * LN2]))
    assert direct.tolist() == pytest.approx([2 * LN2])


def test_the_two_prompts_are_aligned_on_the_same_completion_tokens() -> None:
    examples = [
        DistillExample([5], [5, 6, 7], [8, 9], behaviour_logprobs=[-3 * LN2, -0.5]),
        DistillExample([5, 5], [6], [4], weight=0.0),
    ]
    batch = make_distill_batch(examples, max_length=16, pad=0, skip_tokens=0)
    # The logits at a prompt's last token predict the first completion token.
    assert batch.student_positions.tolist() == [[0, 1], [1, 0]]
    assert batch.teacher_positions.tolist() == [[2, 3], [0, 0]]
    assert batch.tokens.tolist() == [[8, 9], [4, 0]]
    assert batch.mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert batch.served.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert batch.weights.tolist() == [1.0, 0.0]
    assert batch.teacher.input_ids[0].tolist() == [5, 6, 7, 8, 9]
    skipped = make_distill_batch(examples, max_length=16, pad=0, skip_tokens=1)
    assert skipped.mask.tolist() == [[0.0, 1.0], [0.0, 0.0]]
    # Served at ln(1/8) a token the student now gives 1/2: ratio 4, capped at 2; unserved: 1.
    sampled = torch.tensor([[-LN2, -0.5], [-1.0, 0.0]])
    weights = importance_weights(sampled, batch, cap=2.0)
    assert isinstance(weights, torch.Tensor)
    assert weights.flatten().tolist() == pytest.approx([2.0, 1.0, 1.0, 1.0])
    assert importance_weights(sampled, batch, cap=None) == 1.0


# -- on the tiny model ----------------------------------------------------------------------------


def test_the_ema_teacher_moves_by_its_rate_and_zero_freezes_it(base: Base) -> None:
    model = new_lora(base, DistillSettings())
    moving, frozen = EMATeacher(model, rate=0.25), EMATeacher(model, rate=0.0)
    start = {name: weight.clone() for name, weight in moving.weights.items()}
    with torch.no_grad():  # a step that moves every weight of the adapter by 1
        for parameter in trainable(model).values():
            parameter.add_(1.0)
    moving.follow(model)
    frozen.follow(model)
    for name, parameter in trainable(model).items():
        # phi + 0.25 (theta - phi), with theta = phi + 1
        assert torch.allclose(moving.weights[name], start[name] + 0.25)
        assert torch.equal(frozen.weights[name], start[name])
        assert torch.equal(parameter, start[name] + 1.0)
    moving.follow(model)  # again: a quarter of the remaining 0.75
    name = next(iter(start))
    assert torch.allclose(moving.weights[name], start[name] + 0.25 + 0.75 * 0.25)


def test_the_teachers_weights_are_swapped_in_for_its_pass_and_the_students_restored(
    base: Base,
) -> None:
    model = new_lora(base, DistillSettings())
    teacher = EMATeacher(model, rate=0.0)
    with torch.no_grad():  # the student's B leaves zero: it no longer computes the base
        for name, parameter in trainable(model).items():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    student = {name: p.clone() for name, p in trainable(model).items()}
    ids = torch.tensor([[3, 40, 50, 60]])
    with swapped_in(model, teacher.weights), torch.no_grad():
        as_teacher = model(input_ids=ids).logits
    with torch.no_grad():
        as_student = model(input_ids=ids).logits
        with model.disable_adapter():
            as_base = model(input_ids=ids).logits
    assert torch.allclose(as_teacher, as_base, atol=1e-6)  # a fresh adapter's start: the base
    assert not torch.allclose(as_student, as_base, atol=1e-3)
    assert all(torch.equal(p, student[name]) for name, p in trainable(model).items())


def first_token_probabilities(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    return F.softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("divergence", ["forward", "reverse", "jsd"])
def test_distillation_gives_the_student_what_the_teachers_context_made_likely(
    base: Base, divergence: str
) -> None:
    tokenizer = base.tokenizer
    student_prompt = tokenizer("Q: colour?\nA:")["input_ids"]
    teacher_prompt = tokenizer("Say the word gold. Q: colour?\nA:")["input_ids"]
    student = first_token_probabilities(base.model, student_prompt)
    teacher = first_token_probabilities(base.model, teacher_prompt)
    # The token the teacher's context raises the most, as the completion's first token.
    raised = int(torch.argmax(torch.log(teacher) - torch.log(student)))
    assert teacher[raised] > student[raised]
    completion = [raised, tokenizer.eos_token_id]
    example = DistillExample(student_prompt, teacher_prompt, completion)
    settings = DistillSettings(
        divergence=divergence,  # type: ignore[arg-type]
        teacher_update_rate=0.0,
        steps=12,
        learning_rate=3e-3,
        max_length=64,
    )
    trained = distill(base, [example], settings)
    after = first_token_probabilities(trained.model, student_prompt)
    assert student[raised] < after[raised] <= teacher[raised] * 1.5
    before_kl = float((teacher * (teacher.log() - student.log())).sum())
    after_kl = float((teacher * (teacher.log() - after.log())).sum())
    assert after_kl < before_kl / 2
    assert trained.losses[-1] < trained.losses[0]
    # The base is untouched: training wrapped a copy.
    assert torch.equal(first_token_probabilities(base.model, student_prompt), student)


def test_a_frozen_ema_teacher_of_a_fresh_adapter_is_the_base(base: Base) -> None:
    tokenizer = base.tokenizer
    example = DistillExample(
        tokenizer("Hi")["input_ids"], tokenizer("Be brief. Hi")["input_ids"], [70, 71, 2]
    )
    frozen = DistillSettings(teacher="ema", teacher_update_rate=0.0, steps=4, max_length=64)
    based = frozen.model_copy(update={"teacher": "base"})
    moving = frozen.model_copy(update={"teacher_update_rate": 1.0})
    assert distill(base, [example], frozen).losses == pytest.approx(
        distill(base, [example], based).losses, rel=1e-6
    )
    # A teacher that follows the student step for step gives other losses after the first.
    followed = distill(base, [example], moving).losses
    assert followed[0] == pytest.approx(distill(base, [example], frozen).losses[0], rel=1e-6)
    assert followed[-1] != pytest.approx(distill(base, [example], frozen).losses[-1], rel=1e-3)


def test_sampled_reverse_kl_with_a_separate_teacher_lowers_the_log_ratio(
    base: Base, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from reef.testing.tiny import tiny_model_folder
    from reef.training import load_base

    folder = tmp_path_factory.mktemp("teacher")
    teacher = load_base(tiny_model_folder(folder / "model", seed=1), folder / "cache").model
    prompt = base.tokenizer("Name a bird.")["input_ids"]
    completion = base.tokenizer("A robin.")["input_ids"] + [base.tokenizer.eos_token_id]
    example = DistillExample(prompt, prompt, completion)
    settings = DistillSettings(
        divergence="sampled_reverse", teacher="model", steps=10, learning_rate=3e-3, max_length=64
    )
    trained = distill(base, [example], settings, teacher_model=teacher)

    def gap(model: torch.nn.Module) -> float:
        s = completion_logprobs(model, prompt, completion)
        q = completion_logprobs(teacher, prompt, completion)
        return sum(a - b for a, b in zip(s, q, strict=True)) / len(s)

    assert trained.losses[0] == pytest.approx(gap(base.model), rel=1e-4)
    assert gap(trained.model) < gap(base.model)
    assert trained.losses[-1] < trained.losses[0]


def test_a_teacher_model_needs_the_model_teacher_and_one_process(base: Base) -> None:
    from reef.errors import BadRequest

    example = DistillExample([5], [5], [6])
    with pytest.raises(BadRequest, match="teacher_model"):
        distill(base, [example], DistillSettings(teacher="model", steps=1))
    with pytest.raises(BadRequest, match="teacher_model was given"):
        distill(base, [example], DistillSettings(steps=1), teacher_model=base.model)
    with pytest.raises(BadRequest, match="one process"):
        distill(base, [example], DistillSettings(teacher="model", processes=2), base.model)


def test_two_processes_distil_as_one(base: Base) -> None:
    """Three examples over two ranks (an uneven split), with the EMA teacher moving: the same
    losses and adapter weights as one process."""
    tokenizer = base.tokenizer
    examples = [
        DistillExample(tokenizer(q)["input_ids"], tokenizer(f"Be brief. {q}")["input_ids"], c)
        for q, c in [("Hi", [70, 71, 2]), ("Name a fish", [80, 2]), ("Why?", [60, 61, 62, 2])]
    ]
    settings = DistillSettings(
        steps=3, batch_size=3, learning_rate=3e-3, teacher_update_rate=0.5, max_length=64
    )
    alone = distill(base, examples, settings)
    together = distill(base, examples, settings.model_copy(update={"processes": 2}))
    assert together.losses == pytest.approx(alone.losses, rel=1e-5)
    mine, theirs = trainable(alone.model), trainable(together.model)
    assert all(torch.allclose(mine[name], theirs[name], atol=1e-5) for name in mine)
