"""LoRA training and log-prob recomputation on a tiny random llama (2 layers, 64 wide)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer

from reef.errors import BadRequest
from reef.training import (
    Base,
    LoraSettings,
    TrainingExample,
    choose_backend,
    completion_logprobs,
    encode_completion,
    export_adapter,
    train_lora,
)
from reef.training import adapter as adapter_module
from reef.training.adapter import new_lora
from reef.training.loss import batch_loss, example_losses, make_batch, weighted_loss
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name

QUESTIONS = [
    ("Name a colour.", "Red."),
    ("Two plus two?", "Four."),
    ("Capital of France?", "Paris."),
    ("Say hi.", "Hi!"),
]
FAST = LoraSettings(steps=25, learning_rate=1e-2, batch_size=4)


@pytest.fixture(scope="module")
def examples(base: Base) -> list[TrainingExample]:
    made = []
    for question, answer in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        prompt = base.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        made.append(TrainingExample(list(prompt), encode_completion(base.tokenizer, answer)))
    return made


def test_completion_logprobs_are_the_log_softmax_of_the_logits_at_the_completion(
    base: Base, examples: list[TrainingExample]
) -> None:
    prompt, completion = examples[0].prompt_ids, examples[0].completion_ids
    ids = torch.tensor([prompt + completion], device=base.model.device)  # the GPU, on CUDA
    with torch.no_grad():
        logits = base.model(input_ids=ids).logits[0]
    table = F.log_softmax(logits, dim=-1)
    manual = [table[len(prompt) - 1 + i, token].item() for i, token in enumerate(completion)]
    assert completion_logprobs(base.model, prompt, completion) == pytest.approx(manual, abs=1e-5)


def test_a_fresh_lora_is_the_base_until_trained(
    base: Base, examples: list[TrainingExample]
) -> None:
    prompt, completion = examples[1].prompt_ids, examples[1].completion_ids
    fresh = new_lora(base, LoraSettings())
    b_weights = [m.lora_B["default"].weight for m in fresh.modules() if isinstance(m, LoraLayer)]
    assert b_weights and all(torch.count_nonzero(weight) == 0 for weight in b_weights)
    assert completion_logprobs(fresh, prompt, completion) == pytest.approx(
        completion_logprobs(base.model, prompt, completion), abs=1e-6
    )


def test_training_lowers_the_loss_on_its_examples_and_leaves_the_base_alone(
    base: Base, examples: list[TrainingExample]
) -> None:
    before = [completion_logprobs(base.model, e.prompt_ids, e.completion_ids) for e in examples]
    steps: list[tuple[int, float]] = []
    trained = train_lora(base, examples, FAST, on_step=lambda s, loss: steps.append((s, loss)))

    assert [step for step, _ in steps] == list(range(1, FAST.steps + 1))
    assert [loss for _, loss in steps] == trained.losses
    assert trained.losses[-1] < 0.6 * trained.losses[0]
    after = [completion_logprobs(trained.model, e.prompt_ids, e.completion_ids) for e in examples]
    assert sum(map(sum, after)) > sum(map(sum, before))  # the completions got likelier
    if not torch.cuda.is_available():  # Unsloth is chosen only on CUDA, where installed
        assert trained.backend == "peft"
    assert trained.peak_memory_bytes > 0 and trained.seconds > 0
    assert not trained.model.training  # handed back ready to evaluate
    # Training wrapped a copy: the base has no LoRA layers and still gives the same log-probs.
    assert not any(isinstance(module, LoraLayer) for module in base.model.modules())
    again = [completion_logprobs(base.model, e.prompt_ids, e.completion_ids) for e in examples]
    assert again == before


def test_the_same_seed_gives_the_same_losses(base: Base, examples: list[TrainingExample]) -> None:
    settings = FAST.model_copy(update={"steps": 6, "batch_size": 2, "dropout": 0.1})
    first = train_lora(base, examples, settings).losses
    assert train_lora(base, examples, settings).losses == first
    other = settings.model_copy(update={"seed": 1})
    assert train_lora(base, examples, other).losses != first


def test_resuming_continues_from_the_saved_adapter(
    base: Base, examples: list[TrainingExample], tmp_path: Path
) -> None:
    # batch_size = len(examples): every step sees the same batch, so losses compare directly.
    settings = FAST.model_copy(update={"steps": 15})
    trained = train_lora(base, examples, settings)
    export_adapter(trained, tmp_path / "adapter")
    batch = make_batch(examples, settings.max_length, pad_id=base.tokenizer.pad_token_id)
    batch = batch.to(base.model.device)
    with torch.no_grad():
        saved_loss = batch_loss(trained.model, batch).item()

    resumed = train_lora(base, examples, settings, resume_from=tmp_path / "adapter")
    # Exact in float32 (peft); Unsloth trains in bfloat16, where the same loss differs a little.
    same = 1e-5 if trained.model.dtype == torch.float32 else 5e-3

    # The resumed run's first loss is the saved adapter's, not a fresh adapter's ...
    assert resumed.losses[0] == pytest.approx(saved_loss, rel=same)
    # ... which is where the first run ended (one optimiser step past its last recorded loss).
    assert resumed.losses[0] == pytest.approx(trained.losses[-1], rel=0.1)
    assert resumed.losses[0] < 0.7 * trained.losses[0]
    trainable = [p for p in resumed.model.parameters() if p.requires_grad]
    assert trainable, "the resumed adapter must be trainable"
    # The PEFT folder itself works as resume_from too.
    direct = train_lora(
        base,
        examples,
        settings.model_copy(update={"steps": 1}),
        resume_from=tmp_path / "adapter" / "peft",
    )
    assert direct.losses[0] == pytest.approx(saved_loss, rel=same)


def test_nothing_to_train_on_or_nothing_to_resume_is_refused(
    base: Base, examples: list[TrainingExample], tmp_path: Path
) -> None:
    with pytest.raises(BadRequest, match="no training examples"):
        train_lora(base, [], FAST)
    with pytest.raises(BadRequest, match="no PEFT adapter"):
        train_lora(base, examples, FAST, resume_from=tmp_path)


def test_unsloth_is_not_chosen_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Unsloth path (`lora._unsloth_lora`, chosen by `adapter.choose_backend`) is real code
    for CUDA machines with `unsloth` installed. It did NOT run here: this machine has no CUDA,
    and Unsloth cannot even be imported without it. This test checks only the choice."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CPU-only choice cannot be observed")
    assert choose_backend() == "peft"
    # Installed but without CUDA: still peft, and unsloth is never imported.
    monkeypatch.setattr(adapter_module.importlib.util, "find_spec", lambda name: object())
    assert choose_backend() == "peft"
    # With CUDA (pretended) and the package, Unsloth is chosen.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_backend() == "unsloth"


def test_the_loss_on_kept_logits_is_the_loss_on_every_position(
    base: Base, examples: list[TrainingExample]
) -> None:
    """`batch_loss` runs the output layer only from the first completion position on; the loss
    and its gradients are those of the logits at every position."""
    model = new_lora(base, LoraSettings(rank=4))
    padded = [*examples, TrainingExample(examples[0].prompt_ids[-3:], [5, 6, 7, 8, 9, 10])]
    batch = make_batch(padded, max_length=64, pad_id=0).to(base.model.device)
    assert batch.completion_mask[:, 1].sum() == 0  # some prompt positions are skipped
    kept = batch_loss(model, batch)
    kept.backward()
    kept_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    every = weighted_loss(example_losses(logits, batch), batch.weights)
    every.backward()
    every_grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert kept.item() == pytest.approx(every.item(), rel=1e-5)
    for mine, theirs in zip(kept_grads, every_grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)
