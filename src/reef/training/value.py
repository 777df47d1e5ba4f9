"""A critic for single-rollout RL: a value head beside the LoRA, and GAE over a completion.

With one rollout per prompt there is no group to take a baseline from, so a learned value
V(s_t) (the expected final score from the state before token t) stands in for it, as in PPO.
Here the critic is a linear head on the policy model's last hidden state (`ValueHead`), kept in
the recipe's work folder between steps. It reads the hidden states detached: the critic's loss
never moves the LoRA, and one forward pass of the policy serves both (the SAO paper trains a
separate value model; a head is what a CPU can afford beside a LoRA, see docs/recipes.md).

A completion of T tokens gets the reward only at its end (the report's score on the last token,
0 elsewhere), and the state after the last token is terminal (its value 0). Generalised
advantage estimation (Schulman et al. 2015, arXiv:1506.02438):

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)          V(s_T) = 0
    A_t     = delta_t + gamma * lambda * A_{t+1}          A_T = 0
    R_t     = A_t + V(s_t)                                 the critic's target

The policy's lambda adapts to the completion's length, lambda = 1 - 1 / (alpha * T) (VAPO's
length-adaptive GAE, arXiv:2504.05118, which the SAO paper builds on): a long answer's reward
reaches its early tokens, a short answer's advantages lean on the critic. The critic's own
targets use lambda 1 (VAPO's decoupled GAE): the Monte-Carlo return, unbiased by the critic.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def length_adaptive_lambda(length: int, alpha: float) -> float:
    """1 - 1 / (alpha * length), within [0, 1]: the policy's GAE lambda for a completion of
    `length` tokens (alpha 1.5, the paper's: lambda 0.92 at 8 tokens, 0.97 at 20, 0.998 at 400;
    alpha 0.05 would give 0 at 20 tokens or fewer: only the last token would learn)."""
    if length < 1 or alpha <= 0:
        raise ValueError(f"the adaptive lambda needs length >= 1, alpha > 0: {length}, {alpha}")
    return min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length)))


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """Advantages and returns (A_t + V_t) of one completion, its last state terminal."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards for {len(values)} values")
    advantages = [0.0] * len(rewards)
    following = 0.0  # A_{t+1}
    next_value = 0.0  # V(s_{t+1}); 0 after the last token
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        following = delta + gamma * lam * following
        advantages[t] = following
        next_value = values[t]
    returns = [a + v for a, v in zip(advantages, values, strict=True)]
    return advantages, returns


def terminal_rewards(score: float, length: int) -> list[float]:
    """The score on a completion's last token, 0 on the others."""
    return [0.0] * (length - 1) + [float(score)]


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float | None:
    """1 - Var(returns - values) / Var(returns): 1 for a perfect critic, 0 for one that predicts
    the mean, below 0 for worse; None when the returns do not vary (nothing to explain; a NaN
    would not survive the candidate's JSON metrics)."""
    variance = torch.var(returns, unbiased=False)
    if returns.numel() < 2 or float(variance) == 0.0:
        return None
    return float(1.0 - torch.var(returns - values, unbiased=False) / variance)


class ValueHead(torch.nn.Module):
    """V(s) = w . h + b on a hidden state h; starts at 0 everywhere (w = 0, b = 0)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float())[..., 0]

    def save(self, path: Path) -> None:
        """Written whole or not at all (a temporary file renamed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        torch.save(self.state_dict(), partial)
        partial.replace(path)

    @classmethod
    def load_or_new(cls, path: Path | None, hidden_size: int) -> ValueHead:
        """The head saved at `path`, or a fresh one (none saved, or saved for another width)."""
        head = cls(hidden_size)
        if path is not None and path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if saved["linear.weight"].shape == head.linear.weight.shape:
                head.load_state_dict(saved)
        return head


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 * (V - R)^2, the mean over the masked-in tokens."""
    squared = 0.5 * (values - returns) ** 2
    return (squared * mask).sum() / mask.sum().clamp(min=1.0)
