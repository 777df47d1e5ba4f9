"""llama.cpp's own decode speed at batch 1, 2 and 4, with no server: the ceiling any server
built on it reaches here (`bench.speed.decode_ceiling` prints it; `bench.speed.batching` holds
Reef to it)."""


from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from reef.engines.llamacpp import batch_context, embedded_model_path

PROMPT = b"Write a long story about a lighthouse keeper."
SIZES = (1, 2, 4)


def decode_ceiling(
    n_threads: int, steps: int = 25, rounds: int = 8, model: Path | None = None
) -> dict[int, dict[str, float]]:
    """{batch size: {"tokens_per_s", "ms_per_call"}}: the median over `rounds` blocks of `steps`
    decode calls at each size, on `model` (the embedded GGUF when None)."""
    import llama_cpp

    from reef.engines.llamacpp.weights import load_model

    llm = load_model(model or embedded_model_path())
    context = batch_context(llm, 2048, max(SIZES), n_threads)  # the engine's own context
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    try:
        prompt = llm.tokenize(PROMPT, add_bos=True, special=False)
        for sequence in range(max(SIZES)):
            _decode(context.ctx, batch, [(sequence, token, i) for i, token in enumerate(prompt)])
        memory = llama_cpp.llama_get_memory(context.ctx)
        timings: dict[int, list[float]] = {size: [] for size in SIZES}
        for _ in range(rounds):  # interleaved, so a slow spell of the machine hits each alike
            for size in SIZES:
                for sequence in range(max(SIZES)):  # every block decodes after the same prompt
                    llama_cpp.llama_memory_seq_rm(memory, sequence, len(prompt), -1)
                started = time.perf_counter()
                for step in range(steps):
                    position = len(prompt) + step
                    _decode(context.ctx, batch, [(s, 100 + step, position) for s in range(size)])
                timings[size].append((time.perf_counter() - started) / steps)
        results = {}
        for size, per_call in timings.items():
            seconds = statistics.median(per_call)
            results[size] = {"tokens_per_s": size / seconds, "ms_per_call": seconds * 1000}
        return results
    finally:
        llama_cpp.llama_batch_free(batch)
        context.close()
        llm.close()


def _decode(context: Any, batch: Any, tokens: list[tuple[int, int, int]]) -> None:
    """One llama_decode of (sequence, token, position) triples, logits for each."""
    import llama_cpp

    batch.n_tokens = len(tokens)
    for i, (sequence, token, position) in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = position
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = sequence
        batch.logits[i] = True
    code = llama_cpp.llama_decode(context, batch)
    if code != 0:
        raise RuntimeError(f"llama_decode failed with code {code}")


def describe(results: dict[int, dict[str, float]]) -> list[str]:
    lines = [
        f"  batch {size}: {r['tokens_per_s']:6.1f} tokens/s, {r['ms_per_call']:5.1f} ms per call"
        for size, r in results.items()
    ]
    one, four = results[1], results[4]
    lines.append(
        f"  ceiling: batch 4 / batch 1 = {four['tokens_per_s'] / one['tokens_per_s']:.2f}x "
        f"tokens/s; a batch-4 call takes {four['ms_per_call'] / one['ms_per_call']:.2f}x "
        "a batch-1 call"
    )
    return lines
