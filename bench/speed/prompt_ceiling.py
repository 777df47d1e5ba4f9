"""How fast can a long prompt be read on this CPU at all? The attention's floor, per weight format.

    .venv/bin/python -m bench.speed.prompt_ceiling [--formats q8_0 q4_0 bf16] [--rounds 2]

Issue 41 asks for 2.5x today's prompt tokens/s on a 2,000-token prompt and on pi's first request
(4,600 tokens). A prompt token costs the weights' matrix products, which are the same at every
position, plus the attention over every token before it, which grows with the context. A weight
format changes only the first. This bench separates the two, so it says how much any format
could give.

For each format (the shipped Q4_1, and copies written by `reef model prepare`'s conversion into
bench/out/) and each of llama.cpp's two attention paths:

- `reef`: what Reef's engine runs (engines/llamacpp/context.py `batch_context`): K cache q8_0,
  V cache f16, no flash attention, prompts in 64-token blocks;
- `flash`: flash attention's tiled kernel (it runs only on f16 K and V), 512-token blocks;

it times, at 2 threads in a process of its own and straight through llama.cpp's C API (the
model loaded as the engine loads it):

- `prompt`: tokens/s on the N-token prompt, and the ratio against Q4_1 on the `reef` path (the
  baseline, measured in the same run);
- `weights`: the seconds of the work that does not grow with the context (the weights' matrix
  products, and each block's attention within itself), N times the per-token cost fitted to the
  same setting's times on prompts of 512 and 1,024 tokens (a cost per token plus one that grows
  with the context, as causal attention does);
- `attention`: the rest, the prompt's seconds less its weights'.

Under each table, two ceilings against the baseline's time on the N-token prompt: the best parts
together (the fastest weights measured beside the least attention measured, which no single
setting here has), and weights that cost nothing (the least attention alone), the ratio no
weight format could beat. Beside them, each format's prompt tokens/s through Reef's engine itself
(`reef model prepare`'s `speed`: its blocks, slots and thread choice), which is Reef today.
Written to bench/out/prompt_ceiling.json.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common.attention_paths import PATHS, AttentionPath, prompt_seconds
from bench.common.formats import N_THREADS, PROMPTS, format_copies
from bench.common.processes import in_own_process
from bench.common.results import OUT
from reef.engines.llamacpp.convert import FORMATS
from reef.engines.llamacpp.prepare import speed

SHORT = (512, 1024)  # tokens: two prompts, in whole blocks of every path, to fit the per-token cost


def measure(path: Path, attention: AttentionPath, rounds: int) -> dict[str, Any]:
    """One format on one attention path: each prompt's seconds, split into weights and attention."""
    short, longer = SHORT
    first, second = (prompt_seconds(path, attention, n, rounds + 1) for n in SHORT)
    # seconds = per_token * n + growth * n^2: the cost per token, and the one the context adds.
    growth = max(0.0, (second / longer - first / short) / (longer - short))
    per_token = max(0.0, first / short - growth * short)
    figures: dict[str, Any] = {"weights_s_per_token": per_token}
    for tokens in PROMPTS:
        seconds = prompt_seconds(path, attention, tokens, rounds)
        weights = min(seconds, per_token * tokens)
        figures[str(tokens)] = {
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "weights_s": weights,
            "attention_s": seconds - weights,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["q8_0", "q4_0", "bf16"], choices=FORMATS)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    paths = format_copies(options.formats, "q4_1")
    results: dict[str, dict[str, Any]] = {}
    engine: dict[str, dict[str, float]] = {}  # prompt tokens/s through Reef's engine
    for name, path in paths.items():
        for attention in PATHS:
            figures = in_own_process(measure, path, attention, options.rounds)
            results[f"{name} {attention.name}"] = figures
            print(f"measured {name} on the {attention.name} path", flush=True)
        engine[name] = {
            str(tokens): speed(path, N_THREADS, options.rounds, tokens).prompt_tokens_per_s
            for tokens in PROMPTS
        }
        print(f"measured {name} through Reef's engine", flush=True)
    report(results, engine)
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"paths": [asdict(p) for p in PATHS], "results": results, "engine": engine}
    (OUT / "prompt_ceiling.json").write_text(json.dumps(payload, indent=2) + "\n")


def report(results: dict[str, dict[str, Any]], engine: dict[str, dict[str, float]]) -> None:
    base = results["q4_1 reef"]
    print(f"\nprompt reading, {N_THREADS} threads; ratios against q4_1 on Reef's path in this run;")
    print("weights and attention: seconds of the prompt's time, split as above")
    header = "  {:<12} {:>7}  {:>13} {:>8} {:>10}"
    for tokens in PROMPTS:
        key = str(tokens)
        print(f"\n  {tokens:,}-token prompt")
        print(header.format("format", "path", "prompt tok/s", "weights", "attention"))
        for name, figures in results.items():
            row = figures[key]
            ratio = base[key]["seconds"] / row["seconds"]
            print(
                header.format(
                    *name.split(" "),
                    f"{row['tokens_per_s']:.0f} {ratio:.2f}x",
                    f"{row['weights_s']:.1f}s",
                    f"{row['attention_s']:.1f}s",
                )
            )
        today = base[key]["seconds"]
        best = max(today / f[key]["seconds"] for f in results.values())
        weights = min(results.items(), key=lambda item: item[1][key]["weights_s"])
        attention = min(results.items(), key=lambda item: item[1][key]["attention_s"])
        fastest, least = weights[1][key]["weights_s"], attention[1][key]["attention_s"]
        print(f"  best measured: {best:.2f}x")
        print(
            f"  the best parts together: the fastest weights ({weights[0]}, {fastest:.1f}s) and"
            f" the least attention ({attention[0]}, {least:.1f}s): {today:.1f}s /"
            f" {fastest + least:.1f}s = {today / (fastest + least):.2f}x"
        )
        print(f"  weights that cost nothing: {today:.1f}s / {least:.1f}s = {today / least:.2f}x")
        served = engine["q4_1"][key]
        rates = ", ".join(f"{n} {e[key]:.0f} ({e[key] / served:.2f}x)" for n, e in engine.items())
        print(f"  through Reef's engine, tokens/s (against its q4_1, Reef today): {rates}")


if __name__ == "__main__":
    main()
