"""The slots of the llama.cpp KV cache: one sequence id each, and the prompt cache they hold.

The context is made with one KV stream per slot (`kv_unified=False`), each `n_ctx` tokens long,
so a sequence's cache cells never depend on what the other slots hold. A slot keeps its tokens'
KV after its request finishes; the next request picks the free slot whose cache its prompt
continues and evaluates only the rest.

Only whole blocks are reused. llama.cpp's numbers for a token depend slightly on how many tokens
were evaluated with it (the matrix shapes of one call), so a prompt is always evaluated in
aligned blocks of `BLOCK` tokens (the last one partial), and a later prompt reuses only the
leading blocks that were evaluated as whole blocks. A prompt's KV is then computed the same way
whether it is cold, cached or batched with others: the same logits, bit for bit, so a seed and
temperature 0 give the same answer every time, and the cache never has to be thrown away.

A prompt sent again exactly (a retry, the next of n choices, a benchmark, an evaluation task run
twice) is served whole: the slot also keeps the logits of its prompt's last token, which is all
a fresh evaluation would give, so the first token is sampled from them and no prompt token is
evaluated again, not even the last partial block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 64  # prompt tokens per llama_decode call, and the unit of prompt cache reuse


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV the slot holds
    exact: int = 0  # leading tokens evaluated as whole aligned blocks: what a prompt may reuse
    adapter: Path | None = None  # the LoRA adapter the KV was computed under
    last_used: float = 0.0
    busy: bool = False
    # The logits of the last token of the prompt that filled tokens[:prompt_length], kept while
    # those tokens are: a request with that very prompt needs nothing evaluated.
    prompt_logits: np.ndarray | None = None
    prompt_length: int = 0
    # Read in part on weights that no longer read prompts (the prefill lane, given up): nothing
    # it holds is reused, even what a prompt now running in it finishes reading, until emptied.
    distrusted: bool = False

    def reusable(self, prompt: list[int], adapter: Path | None) -> int:
        """How many leading tokens of `prompt` this slot can serve from its cache."""
        if adapter != self.adapter or self.distrusted:
            return 0
        if self.holds_whole(prompt):
            return len(prompt)
        common = 0
        for held, wanted in zip(self.tokens[: self.exact], prompt, strict=False):
            if held != wanted:
                break
            common += 1
        # At least the prompt's last token is evaluated: its logits give the first token.
        return min(common, len(prompt) - 1) // BLOCK * BLOCK

    def holds_whole(self, prompt: list[int]) -> bool:
        """Whether the slot holds `prompt` exactly, with its last token's logits."""
        return (
            self.prompt_logits is not None
            and len(prompt) == self.prompt_length
            and self.tokens[: len(prompt)] == prompt
        )

    def prompt_evaluated(self, last_logits: np.ndarray) -> None:
        """The prompt the slot's tokens now hold is evaluated; keep a copy of its last logits."""
        if self.distrusted:
            return
        self.prompt_logits = np.array(last_logits, copy=True)
        self.prompt_length = len(self.tokens)

    def trim(self, kept: int) -> None:
        """Keep the first `kept` tokens' record (the cache cells are trimmed by the caller)."""
        del self.tokens[kept:]
        self.exact = min(self.exact, kept)
        self.distrusted = self.distrusted and kept > 0
        if kept < self.prompt_length:
            self.prompt_logits, self.prompt_length = None, 0

    def evaluated(self, tokens: list[int], whole_block: bool) -> None:
        """Record tokens just evaluated in this slot's sequence."""
        if whole_block and self.exact == len(self.tokens):
            self.exact += len(tokens)
        self.tokens.extend(tokens)


@dataclass
class CacheCounters:
    prompt_tokens: int = 0  # prompt tokens of every request started
    reused_tokens: int = 0  # of those, served from a slot's cache instead of evaluated


class SlotTable:
    """Hands out free slots, choosing by cached prefix, and trims a slot's cache to its reuse."""

    def __init__(self, memory: Any, n_slots: int) -> None:
        self._memory = memory
        self.slots = [Slot(seq_id) for seq_id in range(n_slots)]
        self.counters = CacheCounters()

    def free(self) -> int:
        return sum(not slot.busy for slot in self.slots)

    def acquire(self, prompt: list[int], adapter: Path | None) -> tuple[Slot, int] | None:
        """A free slot for `prompt` and how many prompt tokens its cache already holds."""
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            return None
        slot = _choose(free, prompt, adapter)
        slot.busy = True
        try:
            return slot, self.reuse(slot, prompt, adapter)
        except BaseException:
            slot.busy = False  # not handed out: free again for the next request
            raise

    def reuse(self, slot: Slot, prompt: list[int], adapter: Path | None) -> int:
        """Keep the part of `slot`'s cache `prompt` reuses, drop the rest; the tokens kept."""
        import llama_cpp

        kept = slot.reusable(prompt, adapter)
        if kept < len(slot.tokens) and not llama_cpp.llama_memory_seq_rm(
            self._memory, slot.seq_id, kept, -1
        ):
            llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, 0, -1)
            kept = 0
        slot.trim(kept)
        slot.adapter = adapter
        self.counters.prompt_tokens += len(prompt)
        self.counters.reused_tokens += kept
        return kept

    def forget(self, slot: Slot) -> None:
        """Drop everything `slot` caches (after a failure its cells may not match its record).
        Removing a whole sequence cannot fail; only a partial removal can."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, 0, -1)
        slot.trim(0)

    def distrust(self) -> None:
        """No slot's cache is reused again: it was read on weights that no longer read prompts
        (a cold read would give other numbers). Its cells go when the slot is next taken."""
        for slot in self.slots:
            slot.distrusted = True
            slot.prompt_logits, slot.prompt_length = None, 0

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.last_used = time.monotonic()


def _choose(free: list[Slot], prompt: list[int], adapter: Path | None) -> Slot:
    """The slot whose cache `prompt` continues (keeping at least half of what it holds, or all
    of the prompt), the one reusing most; otherwise the least recently used, so that a new
    conversation sharing only a system prompt does not evict another agent's conversation while
    an older slot is idle."""
    best = max(free, key=lambda slot: (slot.reusable(prompt, adapter), -slot.last_used))
    kept = best.reusable(prompt, adapter)
    if kept and (kept * 2 >= len(best.tokens) or kept == len(prompt)):
        return best
    return min(free, key=lambda slot: slot.last_used)
