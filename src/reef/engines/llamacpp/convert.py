"""A GGUF written in another weight format by llama.cpp's own conversion (its quantize tool),
for `reef model prepare` and for the copy that reads prompts (prefill_weights.py)."""

from __future__ import annotations

import time
from pathlib import Path

from reef.errors import ReefError

# The formats a copy can take: llama.cpp's file types, by the names its quantize tool prints.
FORMATS = {
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "f32": "LLAMA_FTYPE_ALL_F32",
}


class PrepareError(ReefError):
    """A model could not be prepared (a format llama.cpp refused, a file that is not a GGUF)."""


def convert(source: Path, kind: str, out: Path, threads: int = 0) -> float:
    """Write `source` in format `kind` to `out`; the seconds it took."""
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)  # else llama.cpp prints a line per tensor
    if kind not in FORMATS:
        raise PrepareError(f"unknown weight format {kind!r}: choose one of {', '.join(FORMATS)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FORMATS[kind])
    params.allow_requantize = True  # the source is quantized already
    params.nthread = threads
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if code != 0:
        out.unlink(missing_ok=True)
        raise PrepareError(f"llama.cpp could not write {source.name} as {kind} (code {code})")
    return time.perf_counter() - started
