"""Prompts read on other weights than the ones that decode: a lane of prefill weights whose KV
cache is handed over to a slot of the decoding context (issue 63).

A prompt is read fastest by weights whose matrix kernels suit many tokens at once (F32 or BF16 on
a recent x86), and decoded fastest by weights that are few bytes a token (the shipped Q4_1). Both
copies share the architecture, and contexts made with the same cache types write a sequence's
KV cache in the same format, so a prompt read on the first can be decoded on the second:

1. the lane (a context on the prefill weights, one sequence of `n_ctx` cells) is lent to one
   prompt at a time; it starts from what the slot already holds (copied in, unless the lane
   still holds it from the prompt before);
2. the lane reads every block of the prompt but its last;
3. the lane's sequence is copied into the slot (llama.cpp's sequence state calls), and the last
   block is read on the decoding weights, whose logits give the first token.

Which weights read a block depends only on its place in the prompt (the last block on the
decoding weights, every other on the lane), never on what is cached: the slot counts only the
lane's blocks as reusable (`Slot.exact`), so a prompt's KV is the same whether it is read cold or
continues a cached one, and the prompt cache keeps its bit-for-bit answers (see slots.py).

While one prompt holds the lane, another that needs it waits its turn; a prompt that has only its
last block left reads it at once. A background job (a shadow's copy) stands still while live
requests run, so a live prompt takes the lane from one, which is stopped as it would be for its
slot (`Preempted`). A state that cannot be moved (a llama.cpp whose layout `restream` does not
know) gives the lane up: that prompt and every later one are read on the decoding weights.

A LoRA adapter changes the keys and values a prompt leaves in the cache, so the lane reads every
block under the adapter the request is served with (`take`, `evaluate`), loaded on the lane's
weights as on the served ones. An adapter the lane's weights cannot load (`holds` is False) is
never half applied: its prompts are read whole on the served weights, and the engine's status
names it (`not_on_lane`).
"""

from __future__ import annotations

import ctypes
import struct
import time
from pathlib import Path
from typing import Any

from reef.engines.llamacpp.context import CacheTypes, batch_context
from reef.engines.llamacpp.lora import Adapters
from reef.engines.llamacpp.slots import BLOCK
from reef.engines.llamacpp.weights import Repack, load_model
from reef.errors import EngineUnavailable
from reef.threads import ThreadChoice

LANE_BLOCK = "prefill-weights block"  # the kind of a lane's llama_decode, for ThreadChoice
# A sequence's state, as llama.cpp 0.3.x writes it: 8 bytes, the count of KV streams (u32), then
# per stream the count of its cells (u32) and, when not 0, the cells. A sequence lives in one
# stream, so every other stream's count is 0.
_STREAMS_AT = 8
_U32 = struct.Struct("<I")


class HandOverFailed(EngineUnavailable):
    """A sequence's KV cache could not be moved between the lane and a slot."""


class KVMover:
    """Moves a sequence's KV cache from one context to another, through one buffer kept for
    every move: llama.cpp writes the state into it, the stream counts are set in place, and
    llama.cpp reads it back, with no copy in Python and no new pages after the first move."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def move(self, source: tuple[Any, int], target: tuple[Any, int], streams: int) -> None:
        """Replace the KV cache of `target` (a context and a sequence id; the context has
        `streams` KV streams) with that of `source`."""
        import llama_cpp

        (source_context, source_seq), (target_context, target_seq) = source, target
        size = llama_cpp.llama_state_seq_get_size(source_context, source_seq)
        if len(self._buffer) < size + 4 * streams:
            self._buffer = bytearray(size + 4 * streams)
        written = llama_cpp.llama_state_seq_get_data(
            source_context, (ctypes.c_uint8 * size).from_buffer(self._buffer), size, source_seq
        )
        if written != size:
            raise HandOverFailed(f"llama.cpp wrote {written} of a sequence's {size} bytes")
        offset, length = restream(self._buffer, size, streams)
        state = (ctypes.c_uint8 * length).from_buffer(self._buffer, offset)
        if llama_cpp.llama_state_seq_set_data(target_context, state, length, target_seq) != length:
            raise HandOverFailed(f"llama.cpp could not restore sequence {target_seq}'s KV cache")


def restream(buffer: bytearray, size: int, streams: int) -> tuple[int, int]:
    """Rewrite in place the state in `buffer[:size]`, written by a context of any number of
    KV streams, for a context of `streams`; where it now lies: its offset and length. `buffer`
    has `4 * streams` bytes to spare after `size`.

    llama.cpp refuses a state whose stream count differs from the reading context's, and puts
    the cells of any stream into the stream of the sequence it restores; so the cells move to
    the first stream, the header moves up to meet them, and the other streams count 0."""
    if size < _STREAMS_AT + _U32.size:
        raise HandOverFailed("a sequence state shorter than its header")
    (written,) = _U32.unpack_from(buffer, _STREAMS_AT)
    counts_at = _STREAMS_AT + _U32.size
    # The streams before the sequence's count 0 cells; its own count and cells follow; the
    # streams after it count 0 again, at the end.
    filled = 0
    while filled < written and _U32.unpack_from(buffer, counts_at + 4 * filled)[0] == 0:
        filled += 1
    header = bytes(buffer[:_STREAMS_AT])
    if filled == written:  # an empty sequence
        buffer[_STREAMS_AT:counts_at] = _U32.pack(streams)
        buffer[counts_at : counts_at + 4 * streams] = bytes(4 * streams)
        return 0, counts_at + 4 * streams
    cells_at = counts_at + 4 * filled
    cells_end = size - 4 * (written - filled - 1)
    if cells_end <= cells_at + 4 or any(buffer[cells_end:size]):
        raise HandOverFailed("a sequence state whose layout this llama.cpp does not write")
    offset = cells_at - counts_at
    buffer[offset : offset + _STREAMS_AT] = header
    buffer[offset + _STREAMS_AT : cells_at] = _U32.pack(streams)
    buffer[cells_end : cells_end + 4 * (streams - 1)] = bytes(4 * (streams - 1))
    return offset, cells_end + 4 * (streams - 1) - offset


class PrefillLane:
    """A context on the prefill weights, with one sequence lent to one prompt at a time."""

    def __init__(self, path: Path, model: Any, context: Any, threads: ThreadChoice) -> None:
        import llama_cpp

        self.model_path = path
        self.model = model  # a llama-cpp-python LlamaModel
        self._context = context  # a llama-cpp-python LlamaContext of one KV stream
        self._memory = llama_cpp.llama_get_memory(context.ctx)
        self.adapters = Adapters(model.model, context.ctx)
        self._threads = threads
        self._threads_set: int | None = None
        self._batch = llama_cpp.llama_batch_init(BLOCK, 0, 1)
        self._mover = KVMover()
        self.owner: object | None = None  # the prompt the lane is lent to
        self.tokens: list[int] = []  # the tokens whose KV the lane's sequence holds
        self.adapter: Path | None = None  # the LoRA adapter they were read under
        self.not_on_lane: dict[Path, str] = {}  # adapters the lane's weights cannot load, why
        self.handed_over = 0  # prompts read on the lane and handed to a slot
        self.disabled: str | None = None  # why the lane was given up, if it was
        self.reading_s = 0.0  # seconds spent reading blocks on the lane
        self.moving_s = 0.0  # seconds spent copying KV between the lane and slots

    @property
    def free(self) -> bool:
        return self.owner is None

    def holds(self, adapter: Path | None) -> bool:
        """Whether prompts served under `adapter` can be read on the lane: it loads there (once;
        one that cannot is remembered, and its prompts are read on the served weights)."""
        if adapter is None:
            return True
        if adapter in self.not_on_lane:
            return False
        try:
            self.adapters.load(adapter)
        except Exception as error:  # llama.cpp refused it on these weights
            self.not_on_lane[adapter] = str(error)
            return False
        return True

    def take(
        self,
        owner: object,
        prompt: list[int],
        start: int,
        adapter: Path | None,
        held_in: tuple[Any, int],
    ) -> None:
        """Lend the lane to `owner`, whose prompt's first `start` tokens are held in `held_in`
        (a decoding context and the slot's sequence id): the lane holds them too, kept from
        the prompt before when it continues it, else copied in."""
        import llama_cpp

        if adapter == self.adapter and self.tokens[:start] == prompt[:start]:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, start, -1)
        elif start:
            started = time.perf_counter()
            self.forget()
            self._mover.move(held_in, (self._context.ctx, 0), streams=1)
            self.moving_s += time.perf_counter() - started
        else:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self.tokens, self.adapter, self.owner = list(prompt[:start]), adapter, owner

    def evaluate(self, block: list[int], position: int) -> None:
        """Read `block`, whose first token is at `position`, into the lane's sequence."""
        import llama_cpp

        batch = self._batch
        batch.n_tokens = len(block)
        for i, token in enumerate(block):
            batch.token[i], batch.pos[i] = token, position + i
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, False
        try:
            self.adapters.apply(self.adapter)
            count = self._use_threads()
            started = time.perf_counter()
            code = llama_cpp.llama_decode(self._context.ctx, batch)
            seconds = time.perf_counter() - started
            self._threads.took(LANE_BLOCK, count, seconds)
            self.reading_s += seconds
            if code != 0:
                raise EngineUnavailable(f"llama.cpp could not read a prompt block (code {code})")
        except BaseException:
            self.forget()
            raise
        self.tokens.extend(block)

    def hand_over(self, context: Any, seq_id: int, streams: int) -> None:
        """Copy the lane's sequence into `seq_id` of `context` (of `streams` KV streams), which
        it replaces, and free the lane; the lane keeps its copy for a prompt that continues it."""
        started = time.perf_counter()
        try:
            self._mover.move((self._context.ctx, 0), (context, seq_id), streams)
        finally:
            self.owner = None
        self.moving_s += time.perf_counter() - started
        self.handed_over += 1

    def release(self, owner: object) -> None:
        """`owner` stopped: the lane is free (what it read stays, recorded)."""
        if self.owner is owner:
            self.owner = None

    def forget(self) -> None:
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self.tokens = []

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_batch_free(self._batch)
        self.adapters.close()
        self._context.close()
        self.model.close()

    def _use_threads(self) -> int:
        import llama_cpp

        count = self._threads.threads_for(LANE_BLOCK)
        if count != self._threads_set:
            llama_cpp.llama_set_n_threads(self._context.ctx, count, count)
            self._threads_set = count
        return count


def open_lane(
    path: Path,
    served: Any,
    n_ctx: int,
    n_threads: int,
    cache: CacheTypes,
    threads: ThreadChoice,
    repack: Repack,
) -> PrefillLane:
    """The lane on the GGUF at `path`: its model loaded, refused unless it is the `served`
    model in other weights (its KV cache is handed to the served model's slots), and a
    context of one sequence of `n_ctx` cells."""
    model = load_model(path, repack)
    try:
        _same_shape(served, model, path)
        context = batch_context(model, n_ctx, 1, n_threads, cache)
    except BaseException:
        model.close()
        raise
    return PrefillLane(path, model, context, threads)


def _same_shape(served: Any, other: Any, path: Path) -> None:
    """Refuse prefill weights whose KV cache the served model could not read."""
    import llama_cpp

    def shape(model: Any) -> tuple[int, ...]:
        handle = model.model
        return (
            llama_cpp.llama_model_n_layer(handle),
            llama_cpp.llama_model_n_embd(handle),
            llama_cpp.llama_model_n_head(handle),
            llama_cpp.llama_model_n_head_kv(handle),
            model.n_vocab(),
        )

    if shape(served) != shape(other):
        raise EngineUnavailable(
            f"engine.llamacpp.prefill_weights: {path.name} is not the served model in other "
            f"weights (layers, width, heads, KV heads, vocabulary: {shape(other)} against "
            f"{shape(served)}): name a copy of the same model, or set auto or same"
        )
