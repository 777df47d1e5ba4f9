"""Examples as padded batches, and the loss: weighted mean cross-entropy on completion tokens.

Each example is a prompt (what the model saw) and a completion (what it should say). Only the
completion's tokens are scored; the prompt is context. An example's loss is the mean cross-entropy
over its completion tokens, so a long completion counts as much as a short one; the batch loss is
the mean over examples of `weight * loss`. A weight of 0 drops an example, a negative weight
pushes its completion down (for advantage-weighted recipes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


@dataclass
class TrainingExample:
    prompt_ids: list[int]  # the served prompt's token ids, chat template applied
    completion_ids: list[int]  # the completion's ids, ending with the end-of-turn token
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.completion_ids:
            raise ValueError("a training example needs at least one prompt and one completion id")


@dataclass
class Batch:
    input_ids: torch.Tensor  # (examples, length), right-padded
    attention_mask: torch.Tensor  # (examples, length): 1 on real tokens
    completion_mask: torch.Tensor  # (examples, length): 1 where the token is a completion token
    weights: torch.Tensor  # (examples,)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.weights.to(device),
        )


def fit(example: TrainingExample, max_length: int) -> tuple[list[int], list[int]]:
    """Cut an example to `max_length` tokens: the prompt loses its oldest tokens first.

    At least one prompt token stays (it predicts the first completion token); a completion too
    long even for that keeps its beginning.
    """
    completion = example.completion_ids[: max_length - 1]
    keep = max_length - len(completion)
    prompt = example.prompt_ids[-keep:]
    return prompt, completion


def make_batch(examples: list[TrainingExample], max_length: int, pad_id: int = 0) -> Batch:
    fitted = [fit(example, max_length) for example in examples]
    length = max(len(prompt) + len(completion) for prompt, completion in fitted)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    completion_mask = torch.zeros((len(examples), length), dtype=torch.float32)
    for row, (prompt, completion) in enumerate(fitted):
        end = len(prompt) + len(completion)
        input_ids[row, :end] = torch.tensor(prompt + completion)
        attention_mask[row, :end] = 1
        completion_mask[row, len(prompt) : end] = 1.0
    weights = torch.tensor([example.weight for example in examples], dtype=torch.float32)
    return Batch(input_ids, attention_mask, completion_mask, weights)


def example_losses(logits: torch.Tensor, batch: Batch, start: int = 0) -> torch.Tensor:
    """Each example's mean cross-entropy over its completion tokens, shape (examples,).

    The logits at position t predict the token at t + 1; `logits[:, i]` are those of position
    `start + i` (all positions from 0, or those `completion_logits` kept).
    """
    predicted = logits[:, : batch.input_ids.shape[1] - 1 - start, :].float()
    targets = batch.input_ids[:, start + 1 :]
    mask = batch.completion_mask[:, start + 1 :]
    token_losses = F.cross_entropy(
        predicted.reshape(-1, predicted.shape[-1]), targets.reshape(-1), reduction="none"
    ).view(targets.shape)
    return (token_losses * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def weighted_loss(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (losses * weights).mean()


def completion_logits(model: PreTrainedModel, batch: Batch) -> tuple[torch.Tensor, int]:
    """The logits of the positions from the first that predicts a completion token (of any
    example) to the last, and that first position: the output layer, a product with the whole
    vocabulary and its softmax at every position, runs only where a loss is taken, not over the
    prompts (a tenth to a sixth of a 135M model's training step). The count of positions kept
    is an int, as transformers and Unsloth both read `logits_to_keep`: the last ones."""
    scored = batch.completion_mask.sum(dim=0).nonzero()
    start = max(int(scored[0]) - 1, 0) if len(scored) else 0
    outputs = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        logits_to_keep=batch.input_ids.shape[1] - start,
    )
    return outputs.logits, start


def batch_loss(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """The training loss of `batch` under `model` (gradients flow)."""
    logits, start = completion_logits(model, batch)
    return weighted_loss(example_losses(logits, batch, start), batch.weights)
