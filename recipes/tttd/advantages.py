"""TTT-Discover's entropic advantages, with β chosen per group.

A group is the rollouts sampled from one starting state, with rewards r_1..r_k. The entropic
objective weighs rollout i by exp(β r_i): it aims at the best rollouts rather than the mean.
β is set per group so that the weights q_β(i) ∝ exp(β r_i) are exactly as far from uniform as
KL(q_β ‖ uniform) = ln 2, whatever the rewards' scale, found by bisection (the KL grows with β).

Each rollout's weight uses a leave-one-out normaliser, the mean of the others' exp(β r_j), so a
rollout does not dampen its own weight:

    w_i = exp(β r_i) / ((1 / (k - 1)) Σ_{j≠i} exp(β r_j))        A_i = w_i - 1

Where the target cannot be reached (as many rollouts share the best reward as there are others,
or more: the KL tends to ln(k / #best) ≤ ln 2), β is its ceiling and the best rollouts share the
weight: w = (k - 1) / (#best - 1) each, the others w = 0. A group needs at least 3 rollouts (with
a unique best of 2, the weight has no bound). A group whose rewards are all equal carries no
signal: it gets no advantages (None) and is skipped and counted by the recipe.
"""

from __future__ import annotations

import math

TARGET_KL = math.log(2.0)
MAX_BETA = 1e6


def softmax_weights(rewards: list[float], beta: float) -> list[float]:
    """q_β(i) ∝ exp(β r_i), computed stably."""
    top = max(beta * r for r in rewards)
    exps = [math.exp(beta * r - top) for r in rewards]
    total = sum(exps)
    return [e / total for e in exps]


def kl_from_uniform(rewards: list[float], beta: float) -> float:
    """KL(q_β ‖ uniform) = Σ q log(k q)."""
    k = len(rewards)
    return sum(q * math.log(k * q) for q in softmax_weights(rewards, beta) if q > 0)


def adaptive_beta(
    rewards: list[float], target: float = TARGET_KL, tolerance: float = 1e-10
) -> float:
    """The β ≥ 0 at which KL(q_β ‖ uniform) = target, by bisection.

    When even β → ∞ stays below the target (as many best rollouts as there are others, or more:
    the KL's limit is ln(k / #best)), the largest β tried, `MAX_BETA`, is returned.
    """
    if len(set(rewards)) < 2:
        raise ValueError("all rewards are equal: no β separates them")
    low, high = 0.0, 1.0
    while kl_from_uniform(rewards, high) < target:
        low, high = high, high * 2
        if high > MAX_BETA:
            return MAX_BETA
    for _ in range(200):
        middle = (low + high) / 2
        kl = kl_from_uniform(rewards, middle)
        if abs(kl - target) < tolerance:
            return middle
        low, high = (middle, high) if kl < target else (low, middle)
    return (low + high) / 2


def entropic_advantages(rewards: list[float]) -> tuple[list[float], float] | None:
    """Each rollout's A_i = w_i - 1 and the group's β; None for a group with one reward."""
    if len(rewards) < 3:
        raise ValueError("a group needs at least 3 rollouts (with 2, KL = ln 2 is never reached)")
    if len(set(rewards)) < 2:
        return None
    beta = adaptive_beta(rewards)
    scaled = [beta * r for r in rewards]
    k = len(rewards)
    advantages = []
    for i, own in enumerate(scaled):
        others = [value for j, value in enumerate(scaled) if j != i]
        log_weight = own - log_mean_exp(others)  # in logs: exp(β r) overflows for large β
        advantages.append(math.exp(log_weight) - 1.0)
    assert len(advantages) == k
    return advantages, beta


def log_mean_exp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values) / len(values))
