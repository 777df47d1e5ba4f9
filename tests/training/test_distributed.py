"""Data-parallel training (`reef.training.distributed`) against one process, on the tiny llama.

The two-process runs are real: ranks forked by torch.multiprocessing from a server that imported
the trainers once per test process (or started by torchrun, each importing torch and peft
afresh: most of that test's seconds), and joined in a gloo group on 127.0.0.1.

The examples' completions differ in length (4 to 44 tokens) on purpose. The loss is a mean over
examples of each example's mean over its tokens, so the right weight of a rank's part is its share
of the batch's examples:
- weighting the ranks by their token counts would fail both LoRA comparisons here (checked on the
  gradients in `test_only_the_example_count_weighting_gives_the_single_process_gradient`);
- averaging the ranks' own means would be right for an even split (4 over 2) but wrong for an
  uneven one (3 over 2): the test of the uneven split fails under that scheme (checked on the
  gradients too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.multiprocessing import ProcessRaisedException

from reef.errors import BadRequest
from reef.training import (
    Base,
    LoraSettings,
    PolicyExample,
    PolicySettings,
    TrainedAdapter,
    TrainingExample,
    encode_completion,
    train_lora,
    train_policy,
)
from reef.training.adapter import new_lora
from reef.training.distributed import Group, in_parallel, shard, shard_loss
from reef.training.loss import Batch, batch_loss, make_batch
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name

QUESTIONS = [
    ("Name a colour.", "Red."),
    ("Why is two plus two four?", "Because two and two make four, by counting."),
    ("Capital of France?", "Paris."),
    ("Say hi.", "Hi!"),
]
# Dropout 0: with dropout the ranks draw other masks than one process would. AdamW divides each
# gradient by its own running size, which turns float noise in a gradient near 0 into noise of
# up to the learning rate times its relative size in the update: at 1e-2 one weight here differs
# by 5e-6 after 3 steps, at 3e-3 by 5e-7 (the tolerance below is 1e-5).
SETTINGS = LoraSettings(steps=4, learning_rate=3e-3, batch_size=4)
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
RUNNER = Path(__file__).with_name("distributed_run.py")


@pytest.fixture(scope="module")
def examples(base: Base) -> list[TrainingExample]:
    made = []
    for question, answer in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        prompt = base.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        made.append(TrainingExample(list(prompt), encode_completion(base.tokenizer, answer)))
    return made


def adapter_weights(trained: TrainedAdapter) -> dict[str, torch.Tensor]:
    named = trained.model.named_parameters()
    return {name: p.detach().clone() for name, p in named if p.requires_grad}


def assert_same_training(parallel: TrainedAdapter, single: TrainedAdapter) -> None:
    assert parallel.losses == pytest.approx(single.losses, rel=1e-5)
    ours, theirs = adapter_weights(parallel), adapter_weights(single)
    assert ours.keys() == theirs.keys() and ours
    for name, weight in ours.items():
        torch.testing.assert_close(weight, theirs[name], **TIGHT, msg=name)
    # ... and training moved them: B starts at 0.
    assert any(torch.count_nonzero(w) for name, w in ours.items() if "lora_B" in name)


def test_shards_are_contiguous_cover_the_batch_and_differ_by_at_most_one() -> None:
    assert [shard([7, 8, 9], rank, 2) for rank in range(2)] == [[7, 8], [9]]
    assert [shard(list(range(5)), rank, 3) for rank in range(3)] == [[0, 1], [2, 3], [4]]
    assert [shard([4], rank, 2) for rank in range(2)] == [[4], []]


def test_only_the_example_count_weighting_gives_the_single_process_gradient(
    base: Base, examples: list[TrainingExample]
) -> None:
    """The gradient of the whole batch against three ways of adding up per-shard gradients,
    in this process: `shard_loss` (what the ranks do), token-count weights, and the plain mean
    of the shards' means. Only the first matches; the other two miss by far more than the
    tolerance the two-process tests use, so those tests would fail under either."""
    model = new_lora(base, SETTINGS)
    with torch.no_grad():  # B = 0 would make the gradient of every A zero
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    trainable = [p for p in model.parameters() if p.requires_grad]
    pad_id = base.tokenizer.pad_token_id

    def gradient(loss: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(loss, trainable)
        return torch.cat([g.reshape(-1) for g in grads])

    def batch_of(indices: list[int]) -> Batch:
        return make_batch([examples[i] for i in indices], SETTINGS.max_length, pad_id)

    for chosen in ([0, 1, 2, 3], [0, 1, 2]):  # an even split over 2 ranks, and an uneven one
        single = gradient(batch_loss(model, batch_of(chosen)))
        shards = [shard(chosen, rank, 2) for rank in range(2)]
        ours = sum(gradient(shard_loss(model, batch_of(s), len(chosen))) for s in shards)
        tokens = [float(batch_of(s).completion_mask.sum()) for s in shards]
        by_tokens = sum(
            gradient(batch_loss(model, batch_of(s))) * n / sum(tokens)
            for s, n in zip(shards, tokens, strict=True)
        )
        mean_of_means = sum(gradient(batch_loss(model, batch_of(s))) for s in shards) / 2

        scale = float(single.abs().max())
        torch.testing.assert_close(ours, single, atol=1e-6 * scale, rtol=1e-5)
        assert float((by_tokens - single).abs().max()) > 0.05 * scale
        if len(chosen) % 2:  # uneven shards: the plain mean weighs the lone example double
            assert float((mean_of_means - single).abs().max()) > 0.05 * scale
        else:  # even shards of examples: the plain mean happens to be right
            torch.testing.assert_close(mean_of_means, single, atol=1e-6 * scale, rtol=1e-5)


def test_two_processes_train_the_same_adapter_as_one(
    base: Base, examples: list[TrainingExample]
) -> None:
    single = train_lora(base, examples, SETTINGS)
    steps: list[tuple[int, float]] = []
    parallel = train_lora(
        base,
        examples,
        SETTINGS.model_copy(update={"processes": 2}),
        on_step=lambda step, loss: steps.append((step, loss)),
    )
    assert_same_training(parallel, single)
    assert steps == list(enumerate(parallel.losses, start=1))  # reported here, as they came
    assert parallel.backend == "peft" and not parallel.model.training
    assert parallel.peak_memory_bytes > 0 and parallel.seconds > 0


def test_an_uneven_split_three_over_two_still_matches(
    base: Base, examples: list[TrainingExample]
) -> None:
    # Batches of 3 from 4 examples: shards of 2 and 1, and batches that cross epochs.
    settings = SETTINGS.model_copy(update={"batch_size": 3, "steps": 3})
    single = train_lora(base, examples, settings)
    parallel = train_lora(base, examples, settings.model_copy(update={"processes": 2}))
    assert_same_training(parallel, single)


def test_policy_updates_in_two_processes_match_one(base: Base) -> None:
    # Shards of 2 and 1 examples, the lone one masked out entirely: the policy loss is a mean
    # over examples with trained tokens, 2 here, all on the first rank.
    examples = [
        PolicyExample([5, 6, 7], [8, 9, 10, 11, 12, 13], [1.0, 0.5, -0.5, 1.0, 2.0, 0.5]),
        PolicyExample.sequence([5, 9], [14, 15], advantage=-1.0),
        PolicyExample([5], [16, 17, 18], [1.0, 1.0, 1.0], mask=[0.0, 0.0, 0.0]),
    ]
    settings = PolicySettings(steps=3, learning_rate=3e-3, kl_beta=0.1)
    single = train_policy(base, examples, settings)
    parallel = train_policy(base, examples, settings.model_copy(update={"processes": 2}))
    assert_same_training(parallel, single)


def test_under_torchrun_the_ranks_join_its_group(
    base: Base, examples: list[TrainingExample], tmp_path: Path
) -> None:
    """torchrun starts the ranks (RANK, WORLD_SIZE... set); each calls train_lora itself."""
    settings = SETTINGS.model_copy(update={"batch_size": 3, "steps": 3, "processes": 2})
    job = {
        "model": str(base.weights),
        "cache": str(tmp_path / "cache"),
        "examples": [[e.prompt_ids, e.completion_ids] for e in examples],
        "settings": settings.model_dump(),
        "out": str(tmp_path / "rank{rank}.pt"),
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(RUNNER), str(tmp_path / "job.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(command, env=env, timeout=120, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-4000:]

    single = train_lora(base, examples, settings.model_copy(update={"processes": 1}))
    expected = adapter_weights(single)
    for rank in range(2):  # every rank ends with the same adapter and losses
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert result["losses"] == pytest.approx(single.losses, rel=1e-5)
        assert result["weights"].keys() == expected.keys()
        for name, weight in result["weights"].items():
            torch.testing.assert_close(weight, expected[name], **TIGHT, msg=name)


def stalls_or_fails(
    group: Group, base: Base, examples: list, settings: LoraSettings, *_: object
) -> TrainedAdapter:
    """A rank job: rank 1 fails at once, rank 0 waits far longer than the test."""
    if group.rank == 1:
        raise RuntimeError("rank 1 gave up")
    time.sleep(120)
    raise AssertionError("rank 0 should have been stopped")


def test_a_rank_that_fails_stops_the_others_and_its_error_reaches_the_caller(
    base: Base, examples: list[TrainingExample]
) -> None:
    settings = SETTINGS.model_copy(update={"processes": 2})
    started = time.monotonic()
    with pytest.raises(ProcessRaisedException, match="rank 1 gave up"):
        in_parallel(stalls_or_fails, base, examples, settings, None, None)
    assert time.monotonic() - started < 60  # rank 0 did not sleep its 120 s out


def test_a_launcher_with_another_number_of_ranks_is_refused(
    base: Base, examples: list[TrainingExample], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(BadRequest, match="WORLD_SIZE"):
        train_lora(base, examples, SETTINGS.model_copy(update={"processes": 2}))
