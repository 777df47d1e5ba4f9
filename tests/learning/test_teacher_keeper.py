"""Where a distillation recipe's teacher is kept between steps: beside the adapter it taught,
the newest few only, nothing left of a step that did not finish, nothing for `frozen_release`."""

from __future__ import annotations

import os
from pathlib import Path

from reef.sdk.recipe import StepContext
from reef.sdk.weights import KEPT_TEACHERS, TeacherKeeper


def context(work: Path, adapter: bytes = b"") -> StepContext:
    files = {"adapter.gguf": adapter} if adapter else {}
    return StepContext("default", "default@1", files, work_dir=work)


def test_teachers_are_kept_by_adapter_the_newest_few(tmp_path: Path) -> None:
    for number in range(KEPT_TEACHERS + 3):
        keeper = TeacherKeeper(context(tmp_path, f"adapter {number}".encode()), "ema")
        assert keeper.scratch is not None
        keeper.scratch.parent.mkdir(parents=True, exist_ok=True)
        keeper.scratch.write_bytes(b"teacher")
        os.utime(keeper.scratch, (number, number))  # kept in the order the steps ran
        keeper.keep({"adapter.gguf": f"adapter {number + 1}".encode()})
    kept = sorted(p.name for p in (tmp_path / "teachers/default").iterdir())
    assert len(kept) == KEPT_TEACHERS and not any(name.startswith("training-") for name in kept)
    newest = TeacherKeeper(context(tmp_path, f"adapter {KEPT_TEACHERS + 3}".encode()), "ema")
    assert newest.start is not None and newest.start.is_file()  # the serving adapter's teacher
    oldest = TeacherKeeper(context(tmp_path, b"adapter 1"), "ema")
    assert oldest.start is not None and not oldest.start.exists()  # pruned: starts anew


def test_a_step_that_failed_leaves_nothing_and_frozen_release_keeps_nothing(tmp_path: Path) -> None:
    keeper = TeacherKeeper(context(tmp_path), "initial")
    assert keeper.scratch is not None
    keeper.scratch.parent.mkdir(parents=True)
    keeper.scratch.write_bytes(b"half a teacher")
    keeper.forget_scratch()
    assert list(keeper.scratch.parent.iterdir()) == []
    frozen = TeacherKeeper(context(tmp_path), "frozen_release")
    assert frozen.start is None and frozen.scratch is None


def test_no_teacher_is_kept_for_a_checkpoint_whose_weights_hold_the_student(
    tmp_path: Path,
) -> None:
    """Issue 76: under `checkpoint: true` the teacher kept beside a merged release was found
    again and its factors applied on weights that already held the student's adapter."""
    keeper = TeacherKeeper(context(tmp_path, b"adapter 1"), "ema")
    assert keeper.scratch is not None
    keeper.scratch.parent.mkdir(parents=True, exist_ok=True)
    keeper.scratch.write_bytes(b"teacher")
    merged = {"checkpoint/model.safetensors": b"weights with the student merged"}
    keeper.keep(merged)
    assert list((tmp_path / "teachers/default").iterdir()) == []  # nothing kept, scratch gone
    serving_merged = StepContext("default", "default@2", merged, work_dir=tmp_path)
    assert TeacherKeeper(serving_merged, "ema").start is None  # starts from the merged weights
