"""What batching can gain on this machine: llama.cpp's own decode speed at batch 1 and batch 4.

    .venv/bin/python -m bench.speed.decode_ceiling [--threads 2] [--steps 25] [--rounds 8] [--model
        GGUF]

No server, no sampling, no Python per token beyond filling the batch: `llama_decode` on the
embedded model (or `--model`), one token per sequence per call, 1, 2 or 4 sequences at once,
each in its own KV stream after the same short prompt (as Reef's engine makes its context), in
interleaved rounds. Printed per batch size: tokens/s and milliseconds per call, the medians of
the rounds. The ratios are the ceiling for any server built on llama.cpp here: tokens/s at batch
4 over batch 1 bounds a server's throughput at concurrency 4 over 1, and the time of a batch-4
call over a batch-1 call bounds from below its latency ratio.
`python -m bench.speed.batching --part throughput` runs this beside Reef and prints Reef against it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common.ceilings import decode_ceiling, describe


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
