"""What batching can gain on this machine: llama.cpp's own decode speed at batch 1 and batch 4.

    .venv/bin/python -m bench.decode_ceiling [--threads 2] [--steps 25] [--rounds 8] [--model GGUF]

No server, no sampling, no Python per token beyond filling the batch: `llama_decode` on the
embedded model (or `--model`), one token per sequence per call, 1, 2 or 4 sequences at once,
each in its own KV stream after the same short prompt (as Reef's engine makes its context), in
interleaved rounds. Printed per batch size: tokens/s and milliseconds per call, the medians of
the rounds. The ratios are the ceiling for any server built on llama.cpp here: tokens/s at batch
4 over batch 1 bounds a server's throughput at concurrency 4 over 1, and the time of a batch-4
call over a batch-1 call bounds from below its latency ratio.
`python -m bench.batching --part throughput` runs this beside Reef and prints Reef against it.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=25, help="decode calls per block")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", type=Path, help="a GGUF other than the embedded model")
    options = parser.parse_args()
    which = options.model or "the embedded model"
    print(f"llama.cpp decode on {which}, {options.threads} threads:")
    results = decode_ceiling(options.threads, options.steps, options.rounds, options.model)
    print("\n".join(describe(results)))


if __name__ == "__main__":
    main()
