"""Log-probs of recorded completions under the current weights, and truncated importance ratios.

A record carries the served prompt's ids, the completion's ids and the log-prob of each
completion token under the weights that served it. After an update, recomputing those log-probs
gives per-token importance ratios new / old for off-policy recipes; the ratios are truncated from
above so that one stale, unlikely token cannot dominate a step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def completion_logprobs(
    model: nn.Module, prompt_ids: list[int], completion_ids: list[int]
) -> list[float]:
    """log p(completion token i | prompt, completion[:i]) for each i, in one forward pass."""
    if not prompt_ids or not completion_ids:
        raise ValueError("completion_logprobs needs at least one prompt and one completion id")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()  # no dropout: the weights as they serve
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0]
    finally:
        model.train(was_training)
    # The logits at position t predict the token at t + 1.
    predicting = logits[len(prompt_ids) - 1 : -1].float()
    targets = ids[0, len(prompt_ids) :]
    logprobs = F.log_softmax(predicting, dim=-1).gather(-1, targets[:, None])[:, 0]
    return [float(value) for value in logprobs.cpu()]


def truncated_ratios(new: list[float], old: list[float], cap: float = 2.0) -> list[float]:
    """Per token min(exp(new - old), cap): the ratio of the current weights to the served ones."""
    if len(new) != len(old):
        raise ValueError(f"{len(new)} new log-probs against {len(old)} old ones")
    if cap <= 0:
        raise ValueError("the cap of truncated ratios must be positive")
    ceiling = math.log(cap)
    return [math.exp(min(n - o, ceiling)) for n, o in zip(new, old, strict=True)]
