"""The training loss and batching against hand computations; truncated importance ratios."""

from __future__ import annotations

import math

import pytest
import torch

from reef.training.logprobs import truncated_ratios
from reef.training.lora import LoraSettings
from reef.training.loss import TrainingExample, example_losses, fit, make_batch, weighted_loss

PAD = 9


def log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    total = math.log(sum(math.exp(x - top) for x in row)) + top
    return [x - total for x in row]


def test_the_masked_weighted_loss_equals_a_hand_computation() -> None:
    examples = [
        TrainingExample(prompt_ids=[0], completion_ids=[1, 2], weight=1.0),
        TrainingExample(prompt_ids=[2, 1], completion_ids=[0], weight=0.5),
    ]
    batch = make_batch(examples, max_length=8, pad_id=PAD)
    # Row 0 is [0, 1, 2], row 1 is [2, 1, 0] (no padding needed: both are 3 long).
    assert batch.input_ids.tolist() == [[0, 1, 2], [2, 1, 0]]
    assert batch.completion_mask.tolist() == [[0, 1, 1], [0, 0, 1]]
    logits = [
        [[2.0, 0.5, -1.0], [0.0, 1.0, 3.0], [7.0, 7.0, 7.0]],  # the last row predicts nothing
        [[1.0, 1.0, 1.0], [0.2, -0.3, 0.9], [5.0, -5.0, 0.0]],
    ]
    # Example 0: position 0 predicts token 1, position 1 predicts token 2 (both completion).
    first = -(log_softmax(logits[0][0])[1] + log_softmax(logits[0][1])[2]) / 2
    # Example 1: only position 1 predicting token 0 is a completion token; the prompt's own
    # token at position 1 (predicted from position 0) is masked out.
    second = -log_softmax(logits[1][1])[0]
    expected = (1.0 * first + 0.5 * second) / 2

    per_example = example_losses(torch.tensor(logits), batch)
    assert per_example.tolist() == pytest.approx([first, second], rel=1e-6)
    loss = weighted_loss(per_example, batch.weights)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_uniform_logits_cost_log_vocabulary_per_token_whatever_the_lengths() -> None:
    examples = [
        TrainingExample(prompt_ids=[1, 2, 3], completion_ids=[4]),
        TrainingExample(prompt_ids=[1], completion_ids=[4, 5, 6, 7, 0]),
    ]
    batch = make_batch(examples, max_length=16, pad_id=PAD)
    logits = torch.zeros((2, batch.input_ids.shape[1], 10))
    assert example_losses(logits, batch).tolist() == pytest.approx([math.log(10)] * 2)


def test_padding_is_on_the_right_and_never_scored() -> None:
    examples = [
        TrainingExample(prompt_ids=[1], completion_ids=[2]),
        TrainingExample(prompt_ids=[1, 2, 3], completion_ids=[4, 5]),
    ]
    batch = make_batch(examples, max_length=16, pad_id=PAD)
    assert batch.input_ids.tolist() == [[1, 2, PAD, PAD, PAD], [1, 2, 3, 4, 5]]
    assert batch.attention_mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.completion_mask.tolist() == [[0, 1, 0, 0, 0], [0, 0, 0, 1, 1]]
    # Huge logits for the padding token at the padded positions change nothing.
    logits = torch.zeros((2, 5, 10))
    spoiled = logits.clone()
    spoiled[0, 2:, :] = torch.randn(3, 10) * 100
    assert torch.equal(example_losses(logits, batch), example_losses(spoiled, batch))


def test_long_examples_lose_the_oldest_prompt_tokens_first() -> None:
    example = TrainingExample(prompt_ids=list(range(10)), completion_ids=[20, 21, 22])
    assert fit(example, max_length=8) == ([5, 6, 7, 8, 9], [20, 21, 22])
    assert fit(example, max_length=64) == (list(range(10)), [20, 21, 22])
    # A completion longer than the limit keeps one prompt token and its own beginning.
    assert fit(example, max_length=3) == ([9], [20, 21])


def test_an_example_needs_a_prompt_and_a_completion() -> None:
    with pytest.raises(ValueError):
        TrainingExample(prompt_ids=[], completion_ids=[1])
    with pytest.raises(ValueError):
        TrainingExample(prompt_ids=[1], completion_ids=[])


def test_settings_have_the_documented_defaults_and_refuse_unknown_keys() -> None:
    settings = LoraSettings()
    assert settings.model_dump() == {
        "rank": 8,
        "alpha": 16,
        "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "learning_rate": 5e-4,
        "steps": 40,
        "batch_size": 4,
        "max_length": 512,
        "seed": 0,
        "weight_decay": 0.0,
        "processes": 1,
        "threads": None,
    }
    with pytest.raises(ValueError, match="extra"):
        LoraSettings.model_validate({"rank": 4, "lr": 1e-3})


def test_truncated_ratios_are_exp_of_the_difference_capped_from_above() -> None:
    new = [math.log(0.5), math.log(0.4), -1.0, 0.0]
    old = [math.log(0.25), math.log(0.8), -1.0, -800.0]
    assert truncated_ratios(new, old) == pytest.approx([2.0, 0.5, 1.0, 2.0])
    assert truncated_ratios(new, old, cap=1.5) == pytest.approx([1.5, 0.5, 1.0, 1.5])
    with pytest.raises(ValueError):
        truncated_ratios([0.0], [0.0, 0.0])
