"""The hand-over's pieces that need no model: a sequence's KV state moved between contexts of
different stream counts, the `prefill_weights` setting and its kept verdict, and the slots'
record once the lane is given up."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from reef.engines.llamacpp.handover import HandOverFailed, restream
from reef.engines.llamacpp.prefill_weights import (
    VERDICT,
    forget_copy,
    parse_setting,
    prefill_path,
    read_verdict,
)
from reef.engines.llamacpp.slots import BLOCK, SlotTable
from reef.errors import EngineUnavailable

HEADER = b"\xd8\x3c\x14\xaf" + struct.pack("<I", 2)  # the 8 bytes llama.cpp writes first
CELLS = struct.pack("<I", 3) + b"meta and data of three cells"


def state(streams: int, filled: int | None) -> bytearray:
    counts = [CELLS if i == filled else struct.pack("<I", 0) for i in range(streams)]
    return bytearray(HEADER + struct.pack("<I", streams) + b"".join(counts))


def restreamed(state: bytearray, streams: int) -> bytearray:
    """`state` rewritten in place for `streams` streams, as the mover hands it to llama.cpp."""
    buffer = state + bytearray(b"\xee" * 4 * streams)  # spare bytes, not zero: all written
    offset, length = restream(buffer, len(state), streams)
    return buffer[offset : offset + length]


def test_a_slots_cells_move_to_the_one_stream_of_the_lane() -> None:
    for stream in range(4):  # the header moves up over the counts before the cells
        assert restreamed(state(4, stream), 1) == state(1, 0)


def test_the_lanes_cells_go_to_the_first_of_the_slots_streams() -> None:
    # llama.cpp restores any stream's cells into the stream of the sequence it restores.
    assert restreamed(state(1, 0), 4) == state(4, 0)
    assert restreamed(restreamed(state(4, 3), 1), 4) == state(4, 0)


def test_an_empty_sequence_stays_empty() -> None:
    assert restreamed(state(4, None), 1) == state(1, None)


def test_a_layout_this_llama_cpp_does_not_write_is_refused() -> None:
    not_zero_after = bytearray(HEADER + struct.pack("<I", 2) + CELLS + b"\x01\x00\x00\x00")
    with pytest.raises(HandOverFailed, match=r"layout this llama\.cpp does not write"):
        restreamed(not_zero_after, 1)
    with pytest.raises(HandOverFailed, match="shorter than its header"):
        restreamed(bytearray(HEADER), 1)
    no_cells_after_count = bytearray(HEADER + struct.pack("<II", 1, 3))
    with pytest.raises(HandOverFailed, match="layout"):
        restreamed(no_cells_after_count, 4)


def test_the_setting_reads_auto_same_or_a_path() -> None:
    assert parse_setting("auto") == "auto"
    assert parse_setting("same") == "same"
    assert parse_setting("~/models/copy.gguf") == Path("~/models/copy.gguf").expanduser()


def test_same_reads_prompts_on_the_served_weights(tmp_path: Path) -> None:
    assert prefill_path(tmp_path / "served.gguf", "same", model=None, n_threads=1) is None


def test_a_path_that_is_not_a_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match="not a file: name a GGUF of the same model"):
        prefill_path(tmp_path / "served.gguf", tmp_path / "missing.gguf", None, 1)


def kept(folder: Path, verdict: object, copies: tuple[str, ...] = ("f32",)) -> Path:
    """A verdict file as `auto` keeps it beside its copies, with `verdict` as its content."""
    for kind in copies:
        (folder / f"{kind}.gguf").write_bytes(b"GGUF")
    (folder / VERDICT).write_text(json.dumps(verdict))
    return folder / VERDICT


GOOD = {"served_tokens_per_s": 150.0, "copies_tokens_per_s": {"f32": 210.0}, "chosen": "f32"}


def test_a_kept_verdict_is_read_back(tmp_path: Path) -> None:
    assert read_verdict(kept(tmp_path, GOOD)) == GOOD
    assert read_verdict(kept(tmp_path, {**GOOD, "chosen": None})) is not None


@pytest.mark.parametrize(
    "changed",
    [
        # a file outside the folder, named by the verdict, with a rate of its own
        {"chosen": "../outside", "copies_tokens_per_s": {"../outside": 300.0}},
        {"chosen": "q4_0", "copies_tokens_per_s": {"q4_0": 300.0}},  # not a format auto makes
        {"chosen": ["f32"]},
        {"chosen": "bf16"},  # no rate, and no file
        {"copies_tokens_per_s": {"f32": "fast"}},
        {"copies_tokens_per_s": ["f32"]},
        {"served_tokens_per_s": True},
        {"served_tokens_per_s": None},
    ],
)
def test_a_verdict_that_auto_would_not_write_is_no_verdict(tmp_path: Path, changed: dict) -> None:
    (tmp_path / "outside.gguf").write_bytes(b"GGUF")
    place = tmp_path / "place"
    place.mkdir()
    assert read_verdict(kept(place, {**GOOD, **changed}, ("f32", "q4_0"))) is None


def test_a_corrupt_verdict_or_a_missing_copy_is_no_verdict(tmp_path: Path) -> None:
    (tmp_path / VERDICT).write_text('{"chosen": "f3')
    assert read_verdict(tmp_path / VERDICT) is None
    assert read_verdict(kept(tmp_path, [GOOD])) is None
    record = kept(tmp_path, GOOD)
    (tmp_path / "f32.gguf").unlink()
    assert read_verdict(record) is None


def test_a_copy_that_cannot_be_opened_is_forgotten(tmp_path: Path) -> None:
    record = kept(tmp_path, GOOD)
    forget_copy(tmp_path / "f32.gguf")
    assert not record.exists()


def test_a_distrusted_slot_reuses_nothing_until_it_is_emptied() -> None:
    """A prompt handed over before the lane was given up finishes its last block after: its
    logits must not answer the same prompt again, which a cold read gives other numbers."""
    prompt = list(range(3 * BLOCK + 5))
    table = SlotTable(memory=None, n_slots=1)
    (slot,) = table.slots
    slot.evaluated(prompt[: 3 * BLOCK], whole_block=True)  # read on the lane, handed over
    table.distrust()  # the lane is given up
    slot.evaluated(prompt[3 * BLOCK :], whole_block=False)  # the last block, on Q4_1
    slot.prompt_evaluated(np.zeros(8))
    assert slot.reusable(prompt, None) == 0
    slot.trim(0)  # taken again, emptied
    slot.evaluated(prompt[: 3 * BLOCK], whole_block=True)
    slot.evaluated(prompt[3 * BLOCK :], whole_block=False)
    slot.prompt_evaluated(np.zeros(8))
    assert slot.reusable(prompt, None) == len(prompt)
