"""Fixtures the training tests share: one torch thread, and the tiny random model's base."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from reef.training import Base, load_base
from reef.training.tiny import tiny_model_folder


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: on a shared CPU two spin-wait for each other (docs/training.md), and a
    tiny model gains nothing from two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    """The 2-layer, 64-wide random llama, loaded as a training base."""
    folder = tmp_path_factory.mktemp("tiny")
    return load_base(tiny_model_folder(folder / "model"), folder / "cache")
