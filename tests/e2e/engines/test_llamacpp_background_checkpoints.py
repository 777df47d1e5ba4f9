"""Background work on a checkpoint (a shadow candidate with full weights) on the real llama.cpp
engine: the checkpoint's engine shares the CPU with the one serving, so background work there
yields to a live request on either, and it never unloads a checkpoint a live request used."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from reef.engines.llamacpp import LlamaCppEngine, Preempted
from reef.engines.llamacpp import checkpoints as checkpoints_module
from reef.errors import Overloaded
from reef.testing.artifacts import random_checkpoint
from tests.e2e.engines.test_llamacpp_background import request, run


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three checkpoint releases' folders (copies of one random checkpoint), by name."""
    folder = tmp_path_factory.mktemp("checkpoints")
    random_checkpoint(folder / "merged", scale=0.3)
    names = ("a", "b", "c")
    for name in names:
        shutil.copytree(folder / "merged" / "checkpoint", folder / name / "checkpoint")
    return {name: folder / name / "checkpoint" for name in names}


def test_a_live_request_on_the_served_model_preempts_background_work_on_a_checkpoint(
    checkpoints: dict[str, Path],
) -> None:
    async def scenario(engine: LlamaCppEngine) -> BaseException | object:
        await engine.load_checkpoint(checkpoints["a"], background=True)
        background = asyncio.create_task(
            engine.complete(request(300), checkpoint=checkpoints["a"], background=True)
        )
        await asyncio.sleep(0.5)  # decoding on the checkpoint's own engine and slots
        await engine.complete(request(8))  # a free slot on the served model: no slot is shared
        return (await asyncio.gather(background, return_exceptions=True))[0]

    assert isinstance(run(2, scenario), Preempted)


def test_background_work_on_a_checkpoint_waits_while_the_served_model_is_busy(
    checkpoints: dict[str, Path],
) -> None:
    async def scenario(engine: LlamaCppEngine) -> None:
        live = asyncio.create_task(engine.complete(request(30)))
        await asyncio.sleep(0.1)
        with pytest.raises(Overloaded, match="background work waits for an idle engine"):
            await engine.complete(request(5), checkpoint=checkpoints["a"], background=True)
        await live

    run(2, scenario)


def test_background_work_never_unloads_a_checkpoint_a_live_request_used(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "MAX_CHECKPOINTS", 1)

    async def scenario(engine: LlamaCppEngine) -> list[str]:
        await engine.complete(request(1), checkpoint=checkpoints["a"])
        with pytest.raises(Overloaded, match="would unload one"):
            await engine.complete(request(1), checkpoint=checkpoints["b"], background=True)
        return engine.checkpoints_loaded

    assert run(2, scenario) == ["a"]


def test_a_checkpoint_only_background_work_used_is_the_first_to_go(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "MAX_CHECKPOINTS", 2)

    async def scenario(engine: LlamaCppEngine) -> list[str]:
        await engine.complete(request(1), checkpoint=checkpoints["a"])  # live: a
        await engine.complete(request(1), checkpoint=checkpoints["b"], background=True)
        await engine.complete(request(1), checkpoint=checkpoints["c"])  # live: a place is needed
        return sorted(engine.checkpoints_loaded)

    assert run(2, scenario) == ["a", "c"]  # b went, though a was used longer ago
