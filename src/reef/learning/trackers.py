"""Each learning step's curves, in the tools people read training runs in.

For every candidate a recipe proposes and the gate decides, the worker writes one run: the
recipe's metrics (a list is a curve, one point per training step: `train/loss`; a number is a
point at step 0: `recipe/score_mean`), the gate's scores (`gate/candidate_mean`, ...) and its
decision (`gate/released`, 1 or 0, and the decision's text). The trackers are
`learning.trackers`:

- `tensorboard` (the default) writes TensorBoard event files under
  `<state_dir>/runs/<scenario>/<candidate>`; `tensorboard --logdir .reef/runs` shows them. The
  files are written here, by hand (TFRecord framing with masked CRC-32C around hand-encoded
  `Event` protobufs, as TensorFlow writes them), so neither tensorboard nor protobuf is needed
  at run time: the `test` extra installs tensorboard only to read them back.
- `wandb` and `mlflow` log the same figures when the package is installed (and configured as
  that tool is: `WANDB_API_KEY` or `WANDB_MODE`, `MLFLOW_TRACKING_URI`).

A tracker that cannot start or write is a warning in the log, never a failed step.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("reef.learning")
TRACKERS = ("tensorboard", "wandb", "mlflow")


# -- TensorBoard event files ----------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= 0xFFFFFFFFFFFFFFFF  # int64 as protobuf encodes it (a negative one in ten bytes)
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _scalar_value(tag: str, value: float) -> bytes:
    """`Summary.Value{tag, simple_value}`."""
    return _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)


def _text_value(tag: str, text: str) -> bytes:
    """`Summary.Value{tag, metadata{plugin_data{plugin_name: "text"}}, tensor}`: a string
    tensor of shape [], as TensorBoard's text plugin reads it."""
    metadata = _field(1, _field(1, b"text"))
    tensor = _varint(1 << 3 | 0) + _varint(7) + _field(2, b"") + _field(8, text.encode())
    return _field(1, tag.encode()) + _field(9, metadata) + _field(8, tensor)


def _event(step: int, wall_time: float, summary: bytes | None = None, version: str = "") -> bytes:
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if version:
        out += _field(3, version.encode())
    if summary is not None:
        out += _field(5, summary)
    return out


class EventFileWriter:
    """One TensorBoard event file in `folder`, appended record by record."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0"
        self.path = folder / name
        self._file = self.path.open("ab")
        self._write(_event(0, time.time(), version="brain.Event:2"))

    def _write(self, event: bytes) -> None:
        header = struct.pack("<Q", len(event))
        self._file.write(header + struct.pack("<I", masked_crc(header)))
        self._file.write(event + struct.pack("<I", masked_crc(event)))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        summary = b"".join(_field(1, _scalar_value(tag, v)) for tag, v in values.items())
        self._write(_event(step, time.time(), summary))

    def text(self, step: int, tag: str, text: str) -> None:
        self._write(_event(step, time.time(), _field(1, _text_value(tag, text))))

    def close(self) -> None:
        self._file.flush()
        self._file.close()


# -- the trackers ------------------------------------------------------------------------------


class Tracker(Protocol):
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...

    def text(self, step: int, tag: str, text: str) -> None: ...

    def close(self) -> None: ...


class _WandB:
    def __init__(self, folder: Path, name: str, config: dict[str, Any]) -> None:
        wandb = importlib.import_module("wandb")
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "reef"),
            name=name,
            dir=str(folder),
            config=config,
            reinit=True,
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def text(self, step: int, tag: str, text: str) -> None:
        self._run.summary[tag] = text

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self._mlflow = importlib.import_module("mlflow")
        self._mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "reef"))
        self._run = self._mlflow.start_run(run_name=name)
        self._mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._mlflow.log_metrics({_mlflow_key(k): v for k, v in values.items()}, step=step)

    def text(self, step: int, tag: str, text: str) -> None:
        self._mlflow.set_tag(_mlflow_key(tag), text[:5000])

    def close(self) -> None:
        self._mlflow.end_run()


def _mlflow_key(tag: str) -> str:
    return tag.replace(":", "_")


def run_folder(state_dir: Path, scenario: str, candidate_id: str) -> Path:
    return state_dir / "runs" / scenario / candidate_id


def start_trackers(
    names: Iterable[str], folder: Path, name: str, config: dict[str, Any]
) -> list[Tracker]:
    """The trackers named that start; one that cannot is a warning."""
    started: list[Tracker] = []
    for tracker in dict.fromkeys(names):
        try:
            if tracker == "tensorboard":
                started.append(EventFileWriter(folder))
            elif tracker == "wandb":
                started.append(_WandB(folder, name, config))
            elif tracker == "mlflow":
                started.append(_MLflow(name, config))
        except Exception as error:  # a missing package, a tool not configured: learning goes on
            log.warning("tracker %s did not start (%s: %s)", tracker, type(error).__name__, error)
    return started


# -- what a step writes ---------------------------------------------------------------------------


def curves(metrics: Mapping[str, Any] | None) -> tuple[dict[str, list[float]], dict[str, float]]:
    """A candidate's metrics as curves (a list of numbers: one per training step, from 1) and
    points (a number); a dict one level down is flattened (`critic/loss`)."""
    lines: dict[str, list[float]] = {}
    points: dict[str, float] = {}
    for key, found in _flattened(metrics or {}):
        if isinstance(found, list) and found and all(_number(v) for v in found):
            lines[key] = [float(v) for v in found]
        elif _number(found):
            points[key] = float(found)
    return lines, points


def _flattened(metrics: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, found in metrics.items():
        if isinstance(found, Mapping) and not prefix:
            yield from _flattened(found, f"{key}/")
        else:
            yield f"{prefix}{key}", found


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


GATE_FIGURES = ("current_mean", "candidate_mean", "wins", "losses", "ties", "tasks")


def track_candidate(
    names: Iterable[str],
    state_dir: Path,
    scenario: str,
    recipe: str,
    candidate_id: str,
    metrics: Mapping[str, Any] | None,
    state: str,
    decision: str | None,
    evaluation: Mapping[str, Any] | None,
) -> Path | None:
    """Write one candidate's run to every tracker named; its folder (None: no tracker)."""
    names = [name for name in names if name in TRACKERS]
    if not names:
        return None
    folder = run_folder(state_dir, scenario, candidate_id)
    config = {"scenario": scenario, "recipe": recipe, "candidate": candidate_id}
    trackers = start_trackers(names, folder, f"{scenario}/{candidate_id}", config)
    lines, points = curves(metrics)
    gate = {
        f"gate/{key}": float(evaluation[key])
        for key in GATE_FIGURES
        if evaluation and _number(evaluation.get(key))
    }
    for group, figures in ((evaluation or {}).get("groups") or {}).items():
        for key in ("current_mean", "candidate_mean"):
            if _number(figures.get(key)):
                gate[f"gate/{group}/{key}"] = float(figures[key])
    gate["gate/released"] = 1.0 if state == "released" else 0.0
    steps = max((len(line) for line in lines.values()), default=0)
    for tracker in trackers:
        try:
            for index in range(steps):
                step = {f"train/{k}": v[index] for k, v in lines.items() if index < len(v)}
                tracker.scalars(index + 1, step)
            if points:
                tracker.scalars(0, {f"recipe/{k}": v for k, v in points.items()})
            tracker.scalars(steps, gate)
            tracker.text(steps, "gate/decision", f"{state}: {decision or ''}")
        except Exception as error:
            log.warning("tracker %s failed: %s: %s", type(tracker).__name__, type(error), error)
        finally:
            try:
                tracker.close()
            except Exception as error:
                log.warning("tracker %s did not close: %s", type(tracker).__name__, error)
    return folder if trackers else None
