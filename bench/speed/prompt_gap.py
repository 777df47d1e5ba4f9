"""Does Reef's engine read a prompt as fast as llama.cpp itself, with the same settings? (issue 63)

    .venv/bin/python -m bench.speed.prompt_gap [--formats q4_1 q4_0 q8_0] [--tokens 2000]

`bench.speed.prompt_ceiling` once measured Reef's engine reading Q4_0 and Q8_0 prompts at 0.74x
and 0.79x of llama.cpp's own rate with the same settings, and named two suspects: the context of
several slots, and the thread count chosen per block. For each format (the shipped Q4_1 and
copies written by `reef model prepare`'s conversion), in one run:

- **llama.cpp** (the baseline): the prompt read straight through the C API, in 64-token blocks
  with Reef's cache types (K q8_0, V f16), no flash attention: `prompt_ceiling`'s `reef` path;
- **Reef's engine** (`LlamaCppEngine`) as it serves (4 slots, threads chosen per block), with one
  slot, with the thread choice off, and with both.

Each figure is the best of `--rounds` prompts of `--tokens` tokens, each engine in a process of
its own. Printed as prompt tokens/s and the ratio to llama.cpp's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common.attention_paths import PATHS, prompt_seconds
from bench.common.formats import format_copies
from bench.common.processes import in_own_process
from bench.common.prompts import WORDS
from bench.common.results import OUT

SETTINGS: dict[str, dict[str, Any]] = {
    "engine as served (4 slots, thread choice)": {},
    "one slot": {"slots": 1},
    "thread choice off": {"adaptive_threads": False},
    "one slot, thread choice off": {"slots": 1, "adaptive_threads": False},
}


def engine_rate(path: Path, settings: dict[str, Any], tokens: int, rounds: int) -> float:
    """Prompt tokens/s of Reef's engine on `path` with `settings`, the best of `rounds`."""
    from llama_cpp import _logger

    from reef.engines.llamacpp.engine import LlamaCppEngine
    from reef.engines.llamacpp.prepare import _request

    _logger.set_verbose(False)

    async def measure() -> float:
        engine = LlamaCppEngine(
            model_path=path, n_ctx=tokens + 256, n_threads=2, stop_loops=False, **settings
        )
        await engine.start()
        try:
            await engine.complete(_request("Hi", 4))  # weights paged in
            best = 0.0
            for round_ in range(rounds):
                text = " ".join([str(round_), *WORDS[: tokens - 40]])  # no cached prompt
                started = time.perf_counter()
                done = await engine.complete(_request(text, 1))
                seconds = time.perf_counter() - started
                best = max(best, (done.usage or {})["prompt_tokens"] / seconds)
            return best
        finally:
            await engine.close()

    return asyncio.run(measure())


def direct_rate(path: Path, tokens: int, rounds: int) -> float:
    """llama.cpp's own prompt tokens/s with the engine's settings (`prompt_ceiling`'s path)."""
    return tokens / prompt_seconds(path, PATHS[0], tokens, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["q4_1", "q4_0", "q8_0"])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = format_copies([f for f in args.formats if f != "q4_1"], shipped="q4_1")
    table = Table(title=f"prompt tokens/s at {args.tokens} tokens, 2 threads")
    table.add_column("format")
    table.add_column("llama.cpp (baseline)", justify="right")
    for name in SETTINGS:
        table.add_column(name, justify="right")
    results: dict[str, dict[str, float]] = {}
    for kind in args.formats:
        path = paths[kind]
        found = {"llama.cpp": in_own_process(direct_rate, path, args.tokens, args.rounds)}
        for name, settings in SETTINGS.items():
            found[name] = in_own_process(engine_rate, path, settings, args.tokens, args.rounds)
        results[kind] = found
        base = found["llama.cpp"]
        cells = [f"{found[name]:.0f} ({found[name] / base:.2f}x)" for name in SETTINGS]
        table.add_row(kind, f"{base:.0f}", *cells)
    Console().print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prompt_gap.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
