"""Each training step's torch thread count (`LoraSettings.threads`), with the step times
scripted where the choice is what is checked, and one real run on the tiny model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from reef.training import Base, LoraSettings, TrainingExample, train_lora
from reef.training import adapter as adapter_module
from reef.training.adapter import StepThreads
from tests.support.training import base, one_thread

__all__ = ["base", "one_thread"]  # shared fixtures, used by name


def scripted_steps(
    monkeypatch: pytest.MonkeyPatch, threads: StepThreads, steps: int, seconds: dict[int, float]
) -> list[int]:
    """`steps` steps, each taking what `seconds` says for the count it was given."""
    now = [0.0]
    monkeypatch.setattr(adapter_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    with threads:
        for _ in range(steps):
            threads.before_step()
            now[0] += seconds[torch.get_num_threads()]
            threads.after_step()
    return threads.used


def test_auto_uses_every_cpu_when_it_is_faster_and_one_when_it_buys_little(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = torch.get_num_threads()
    monkeypatch.setattr(adapter_module, "available_cpus", lambda: 2)
    quiet = scripted_steps(monkeypatch, StepThreads("auto"), 30, {2: 2.2, 1: 3.6})
    assert quiet[:3] == [2, 2, 1]  # the first step warms up, then each count is timed
    assert quiet[3:].count(2) >= 25
    beside_a_server = scripted_steps(monkeypatch, StepThreads("auto"), 30, {2: 3.5, 1: 3.6})
    assert beside_a_server[3:].count(1) >= 25
    assert torch.get_num_threads() == before  # put back when the run ends


def test_a_count_fixes_the_threads_and_none_leaves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    fixed = scripted_steps(monkeypatch, StepThreads(2), 3, {2: 1.0, 1: 1.0})
    assert fixed == [2, 2, 2] and torch.get_num_threads() == 1
    assert scripted_steps(monkeypatch, StepThreads(None), 3, {1: 1.0}) == [1, 1, 1]
    rank = scripted_steps(monkeypatch, StepThreads(2, alone=False), 2, {1: 1.0})
    assert rank == [1, 1]  # a data-parallel rank keeps the share it was spawned with


def test_a_run_on_auto_trains_and_puts_the_threads_back(
    base: Base, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adapter_module, "available_cpus", lambda: 2)
    prompt = base.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True
    )
    example = TrainingExample(list(prompt), base.tokenizer.encode("Hi!"))
    torch.set_num_threads(3)  # neither count auto chooses from
    try:
        trained = train_lora(base, [example], LoraSettings(steps=4, threads="auto"))
        assert len(trained.losses) == 4 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(1)


def test_threads_are_a_count_or_auto() -> None:
    with pytest.raises(ValidationError, match="auto"):
        LoraSettings(threads="fast")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        LoraSettings(threads=0)
