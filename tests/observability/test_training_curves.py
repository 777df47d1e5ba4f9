"""A real `sft` round in the learning worker, on the tiny random model, writes TensorBoard event
files under `.reef/runs/<scenario>/<candidate>` that TensorBoard's own reader reads back: the
loss at every training step, the gate's figures and its decision. A tracker that cannot start
(wandb, not installed here) is a warning, and the step stands."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import pytest

from reef.config import load_config
from reef.engines.upstream import UpstreamEngine
from reef.inference.model import LocalModel
from reef.learning.trackers import EventFileWriter, crc32c, masked_crc
from reef.learning.worker import LearningWorker
from reef.store import ExperienceStore
from tests.support.distillation import served, tiny_model
from tests.support.training import one_thread

__all__ = ["one_thread", "tiny_model"]  # shared fixtures, used by name

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
STEPS = 5


def test_crc32c_is_castagnoli_s() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert masked_crc(b"") == ((0 >> 15 | (0 << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_an_sft_round_writes_its_loss_per_step_for_tensorboard(
    tmp_path: Path, tiny_model: Path, one_thread: None, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\n"
        f"engine:\n  kind: llamacpp\n  llamacpp: {{model: {tiny_model}}}\n"
        "gate:\n  policy: always\n"
        "learning:\n  recipe: sft\n  batch_size: 2\n"
        f"  steps: {STEPS}\n  learning_rate: 0.003\n  max_length: 128\n  replay: 0\n"
        "  hint_distillation: false\n  trackers: [tensorboard, wandb]\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    # The gate's policy releases without evaluating and sft asks the model nothing here (no
    # replay, no hindsight): the worker's model is never called, so it need not answer.
    model = LocalModel(UpstreamEngine("http://127.0.0.1:9/v1"))
    with ExperienceStore(config.experience_db) as store:
        for question, answer in (("Name a fish.", "Sure! Cod."), ("Name a bird.", "Sure! Owl.")):
            served(store, question, "No.", score=0.0, feedback={"demonstration": answer})
        worker = LearningWorker(config, store, model)
        with caplog.at_level(logging.WARNING, logger="reef.learning"):
            result = asyncio.run(worker.step("default", force=True))
        assert result.candidate_id is not None
        trained = worker.workflow.candidates.get(result.candidate_id).metrics or {}
    # Trained and gated; whether it is then published depends on the worker holding the
    # scenario's lease (a step run alone may not): the curves are written either way.
    assert result.outcome in ("released", "rejected"), result.detail
    assert result.candidate_id is not None
    if not _installed("wandb"):
        assert any("tracker wandb did not start" in r.getMessage() for r in caplog.records)

    run = tmp_path / ".reef/runs/default" / result.candidate_id
    assert list(run.glob("events.out.tfevents.*"))
    events = event_accumulator.EventAccumulator(str(run))
    events.Reload()
    tags = events.Tags()
    losses = events.Scalars("train/loss")
    assert [event.step for event in losses] == list(range(1, STEPS + 1))
    assert [event.value for event in losses] == pytest.approx(trained["loss"], rel=1e-6)
    (released,) = events.Scalars("gate/released")
    assert released.value == (1.0 if result.outcome == "released" else 0.0)
    assert "gate/decision" in tags["tensors"]
    (decision,) = events.Tensors("gate/decision")
    assert decision.tensor_proto.string_val[0].decode().startswith(f"{result.outcome}: ")


def test_the_writer_s_frames_are_tfrecords(tmp_path: Path) -> None:
    writer = EventFileWriter(tmp_path)
    writer.scalars(3, {"a/b": 0.5})
    writer.close()
    data = writer.path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert struct.unpack("<I", data[8:12])[0] == masked_crc(data[:8])
    body = data[12 : 12 + length]
    assert struct.unpack("<I", data[12 + length : 16 + length])[0] == masked_crc(body)
    events = event_accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    (point,) = events.Scalars("a/b")
    assert (point.step, point.value) == (3, 0.5)


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
