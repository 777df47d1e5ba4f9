"""The policy loss against hand computations, and policy updates on a tiny random model."""

from __future__ import annotations

import math

import pytest
import torch

from reef.training import Base
from reef.training.logprobs import completion_logprobs
from reef.training.policy import (
    PolicyExample,
    PolicySettings,
    clipped_objective,
    k3_kl,
    make_policy_batch,
    policy_loss,
    train_policy,
)
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name


def test_the_clipped_objective_takes_the_pessimistic_side_of_each_clip() -> None:
    ratios = [1.5, 0.5, 0.5, 1.5, 1.1]
    advantages = [1.0, 1.0, -1.0, -1.0, 2.0]
    old = torch.zeros(5)
    new = torch.log(torch.tensor(ratios))
    loss = clipped_objective(new, old, torch.tensor(advantages), clip_low=0.2, clip_high=0.28)
    expected = [
        -1.28,  # r 1.5 with A > 0: clipped at 1 + 0.28
        -0.5,  # r 0.5 with A > 0: the unclipped ratio is already the smaller
        0.8,  # r 0.5 with A < 0: clipped at 1 - 0.2, -min(-0.5, -0.8)
        1.5,  # r 1.5 with A < 0: unclipped, -min(-1.5, -1.28)
        -2.2,  # r 1.1 inside the clip range: r A
    ]
    assert loss.tolist() == pytest.approx(expected, abs=1e-6)


def test_k3_is_zero_on_the_base_and_matches_its_formula_elsewhere() -> None:
    new = torch.tensor([-1.0, -2.0, -0.5])
    reference = torch.tensor([-1.0, -1.0, -1.5])
    expected = [0.0, math.exp(1.0) - 1.0 - 1.0, math.exp(-1.0) + 1.0 - 1.0]
    assert k3_kl(new, reference).tolist() == pytest.approx(expected, abs=1e-6)


def test_the_batch_loss_averages_tokens_per_example_then_examples_and_skips_masked() -> None:
    examples = [
        PolicyExample([5], [6, 7], advantages=[1.0, 3.0]),
        PolicyExample([5, 5], [8], advantages=[-2.0]),
        PolicyExample([5], [9], advantages=[4.0], mask=[0.0]),  # masked: not in the mean
    ]
    batch = make_policy_batch(examples, max_length=8, pad_id=0)
    # Shifted frame: row 0 trains columns 0 and 1, row 1 column 1, row 2 nothing.
    assert batch.mask.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert batch.advantages.tolist() == [[1.0, 3.0], [0.0, -2.0], [4.0, 0.0]]
    zeros = torch.zeros(3, 2)
    settings = PolicySettings(kl_beta=0.5)
    # On-policy (new = old) the ratio is 1, so each token's loss is -A; KL is 0 at new = base.
    on_policy = policy_loss(zeros, zeros, zeros, batch, settings)
    assert float(on_policy) == pytest.approx(((-(1.0 + 3.0) / 2) + 2.0) / 2)
    # With the base one nat above the policy on every token, each trained token adds
    # 0.5 * (e - 2) of KL.
    kl = policy_loss(zeros, zeros, torch.ones(3, 2), batch, settings)
    assert float(kl) == pytest.approx(float(on_policy) + 0.5 * (math.e - 2.0), abs=1e-6)


def test_served_log_probs_weight_each_token_by_a_truncated_importance_ratio() -> None:
    # One example of three tokens, A = 1 on each, on-policy (new = old), so each token's PPO
    # term is -1 before weighting. The trained policy (old) gives each token p = 0.5; the serving
    # engine sampled them with p = 0.25, 0.5 and 0.8:
    #   w = min(0.5 / 0.25, 1.5) = 1.5 (truncated), 0.5 / 0.5 = 1, 0.5 / 0.8 = 0.625.
    served = [math.log(0.25), math.log(0.5), math.log(0.8)]
    example = PolicyExample([5], [6, 7, 8], [1.0, 1.0, 1.0], behaviour_logprobs=served)
    batch = make_policy_batch([example], max_length=8, pad_id=0)
    old = torch.full((1, 3), math.log(0.5))
    settings = PolicySettings(kl_beta=0.0, tis_cap=1.5)
    loss = policy_loss(old, old, old, batch, settings)
    assert float(loss) == pytest.approx(-(1.5 + 1.0 + 0.625) / 3, abs=1e-6)
    # Without the correction, or without served log-probs, every weight is 1.
    uncorrected = PolicySettings(kl_beta=0.0, tis_cap=None)
    assert float(policy_loss(old, old, old, batch, uncorrected)) == pytest.approx(-1.0)
    unknown = make_policy_batch([PolicyExample([5], [6, 7, 8], [1.0] * 3)], 8, 0)
    assert float(policy_loss(old, old, old, unknown, settings)) == pytest.approx(-1.0)


def test_served_log_probs_must_match_the_completion() -> None:
    with pytest.raises(ValueError, match="2 served log-probs for 3 tokens"):
        PolicyExample([5], [6, 7, 8], [1.0] * 3, behaviour_logprobs=[-1.0, -1.0])


def test_a_long_prompt_is_cut_from_the_left_and_advantages_follow_their_tokens() -> None:
    example = PolicyExample(list(range(10, 20)), [1, 2, 3], advantages=[0.1, 0.2, 0.3])
    batch = make_policy_batch([example], max_length=5, pad_id=0)
    assert batch.batch.input_ids.tolist() == [[18, 19, 1, 2, 3]]
    assert batch.advantages[0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_positive_advantages_raise_a_completion_and_negative_ones_lower_it(base: Base) -> None:
    prompt = base.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    good = base.tokenizer.encode("yes<|im_end|>")
    bad = base.tokenizer.encode("no<|im_end|>")
    before_good = sum(completion_logprobs(base.model, prompt, good))
    before_bad = sum(completion_logprobs(base.model, prompt, bad))
    examples = [
        PolicyExample.sequence(prompt, good, advantage=1.0),
        PolicyExample.sequence(prompt, bad, advantage=-1.0),
    ]
    settings = PolicySettings(steps=8, learning_rate=1e-2, rank=4, alpha=8)
    trained = train_policy(base, examples, settings)
    after_good = sum(completion_logprobs(trained.model, prompt, good))
    after_bad = sum(completion_logprobs(trained.model, prompt, bad))
    assert after_good > before_good + 0.1
    assert after_bad < before_bad - 0.1
    assert len(trained.losses) == 8
    # The first step is on-policy and the adapter starts as the base: the loss is the mean
    # advantage's negative, (-1 + 1) / 2, with no KL yet.
    assert trained.losses[0] == pytest.approx(0.0, abs=1e-5)


def test_the_kl_penalty_holds_the_policy_nearer_the_base(base: Base) -> None:
    prompt = base.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    answer = base.tokenizer.encode("yes<|im_end|>")
    before = sum(completion_logprobs(base.model, prompt, answer))
    examples = [PolicyExample.sequence(prompt, answer, advantage=1.0)]

    def moved(kl_beta: float) -> float:
        settings = PolicySettings(steps=12, learning_rate=1e-2, rank=4, alpha=8, kl_beta=kl_beta)
        trained = train_policy(base, examples, settings)
        return sum(completion_logprobs(trained.model, prompt, answer)) - before

    assert 0 < moved(kl_beta=5.0) < moved(kl_beta=0.0)


def test_an_example_with_mismatched_advantages_is_refused() -> None:
    with pytest.raises(ValueError, match="2 advantages for 3 tokens"):
        PolicyExample([1], [2, 3, 4], advantages=[1.0, 1.0])
