"""The critic's pieces and SAO's loss against hand computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from reef.training.sao import sao_loss  # noqa: E402
from reef.training.value import (  # noqa: E402
    ValueHead,
    explained_variance,
    gae,
    length_adaptive_lambda,
    terminal_rewards,
    value_loss,
)


def test_gae_matches_a_hand_computed_sequence() -> None:
    # rewards 0, 0, 1 (the score on the last token); V = 0.5, 0.2, 0.4; gamma 0.9, lambda 0.5
    # t=2: delta = 1 + 0.9 * 0 - 0.4 = 0.6                   A = 0.6
    # t=1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16                A = 0.16 + 0.45 * 0.6 = 0.43
    # t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32               A = -0.32 + 0.45 * 0.43 = -0.1265
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.2, 0.4], gamma=0.9, lam=0.5)
    assert advantages == pytest.approx([-0.1265, 0.43, 0.6])
    assert returns == pytest.approx([0.3735, 0.63, 1.0])


def test_gae_with_lambda_one_gives_the_monte_carlo_return_and_lambda_zero_one_step() -> None:
    values = [0.3, -0.2, 0.7]
    _, returns = gae(terminal_rewards(2.0, 3), values, gamma=1.0, lam=1.0)
    assert returns == pytest.approx([2.0, 2.0, 2.0])  # whatever the critic says
    advantages, _ = gae(terminal_rewards(2.0, 3), values, gamma=1.0, lam=0.0)
    assert advantages == pytest.approx([-0.2 - 0.3, 0.7 + 0.2, 2.0 - 0.7])


def test_the_length_adaptive_lambda_is_one_minus_one_over_alpha_l() -> None:
    assert length_adaptive_lambda(400, 0.05) == pytest.approx(0.95)
    assert length_adaptive_lambda(2000, 0.05) == pytest.approx(0.99)
    assert length_adaptive_lambda(40, 0.05) == pytest.approx(0.5)
    assert length_adaptive_lambda(10, 0.05) == 0.0  # 1 - 2 < 0: held at 0
    with pytest.raises(ValueError):
        length_adaptive_lambda(0, 0.05)


def test_explained_variance_of_perfect_mean_and_no_critic() -> None:
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert explained_variance(returns.clone(), returns) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 0.5), returns) == pytest.approx(0.0)
    # V = 0.25 everywhere but the first: Var(R - V) / Var(R) by hand
    values = torch.tensor([0.0, 0.25, 0.25, 0.25])
    residual = returns - values  # 1, -0.25, 0.75, -0.25: mean 0.3125
    var = float(((residual - 0.3125) ** 2).mean())
    assert explained_variance(values, returns) == pytest.approx(1.0 - var / 0.25)
    assert explained_variance(torch.zeros(3), torch.ones(3)) is None  # nothing to explain


def test_the_value_head_starts_at_zero_and_survives_a_save(tmp_path: Path) -> None:
    head = ValueHead(4)
    assert torch.equal(head(torch.randn(2, 3, 4)), torch.zeros(2, 3))
    with torch.no_grad():
        head.linear.bias.fill_(0.5)
    head.save(tmp_path / "critic.pt")
    again = ValueHead.load_or_new(tmp_path / "critic.pt", 4)
    with torch.no_grad():
        assert float(again(torch.zeros(1, 4))[0]) == 0.5
        fresh = ValueHead.load_or_new(tmp_path / "critic.pt", 8)  # saved for another width
        assert float(fresh(torch.zeros(1, 8))[0]) == 0.0


def test_the_value_loss_is_half_the_mean_squared_error_on_masked_tokens() -> None:
    values = torch.tensor([[0.0, 1.0, 5.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(value_loss(values, returns, mask)) == pytest.approx(0.5 * (1.0 + 0.0) / 2)


def test_the_sao_loss_on_two_tokens_matches_a_hand_computation() -> None:
    # Token 0: r = 0.5 / 0.4 = 1.25, inside [0.8, 1.28]; token 1: r = 0.6 / 0.4 = 1.5, outside.
    new = torch.tensor([[math.log(0.5), math.log(0.6)]], requires_grad=True)
    behaviour = torch.tensor([[math.log(0.4), math.log(0.4)]])
    advantages = torch.tensor([[2.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, clipped = sao_loss(new, behaviour, advantages, mask, 0.2, 0.28)
    # -(1.25 * 2 + 0) / 2 tokens
    assert float(loss.detach()) == pytest.approx(-1.25)
    assert float(clipped) == pytest.approx(0.5)
    loss.backward()
    assert new.grad is not None
    # d/d new_0 of -(r_0 * A_0) / 2 = -(r_0 * A_0) / 2 = -1.25; the masked token: none at all
    assert new.grad[0].tolist() == pytest.approx([-1.25, 0.0])


def test_the_hard_mask_drops_a_token_below_the_floor_whatever_its_advantage() -> None:
    # r = 0.7: below 1 - 0.2. PPO's min() would still push a negative advantage through it.
    new = torch.tensor([[math.log(0.7)]], requires_grad=True)
    loss, clipped = sao_loss(
        new, torch.zeros(1, 1), torch.tensor([[-3.0]]), torch.ones(1, 1), 0.2, 0.28
    )
    loss.backward()
    assert (float(loss.detach()), float(clipped)) == (0.0, 1.0)
    assert new.grad is not None and float(new.grad[0, 0]) == 0.0
