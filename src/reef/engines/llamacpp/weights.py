"""A GGUF's weights loaded for llama.cpp, with kernels that run on this machine.

llama.cpp can repack weights at load time into "extra buffer types" whose matrix kernels are
faster: AMX tiles on recent Xeons, interleaved AVX/NEON layouts for Q4_0 and a few others
(llama-server's `--repack` / `--no-repack`). The llama.cpp that Reef pins (llama-cpp-python
0.3.36) crashes in its AMX kernels wherever a build compiled them in, which a native build does
on any CPU with AMX: SIGILL at the first `tileloadd` of a prompt (the kernels' tile configuration
is lost before use; an upstream fix is under review as ggml-org/llama.cpp#26954). So `auto`
repacks everywhere except where the build has AMX kernels, where the weights stay as the file
has them and the AVX-512 kernels run them.

The model object also tokenizes, detokenizes and carries the GGUF's metadata (chat template),
so the engine holds one model, not a tokenizer model beside a weights model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from reef.errors import EngineUnavailable

Repack = Literal["auto"] | bool
# The feature llama.cpp's system-information line names for a build with AMX kernels.
AMX_FEATURE = "AMX_INT8 = 1"


def build_has_amx() -> bool:
    """Whether the installed llama.cpp was built with its AMX kernels."""
    import llama_cpp

    return AMX_FEATURE in llama_cpp.llama_print_system_info().decode(errors="replace")


def repacks(setting: Repack) -> bool:
    """Whether to load weights into llama.cpp's extra buffer types, for `setting` on this build."""
    if setting == "auto":
        return not build_has_amx()
    return bool(setting)


def model_params(repack: Repack = "auto", vocab_only: bool = False) -> Any:
    """llama.cpp model parameters: memory-mapped weights, repacked as `repacks` decides."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = repacks(repack)
    params.vocab_only = vocab_only
    return params


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def check_gguf(path: Path) -> None:
    """Refuse, in a sentence, a file that is not a GGUF (llama.cpp would say only that it
    failed to load it, under a traceback)."""
    with path.open("rb") as file:
        start = file.read(len(GGUF_MAGIC))
    if start != GGUF_MAGIC:
        raise EngineUnavailable(
            f"{path} is not a GGUF file (it starts with {start!r}, not {GGUF_MAGIC!r}): "
            "engine.llamacpp.model (or --model) takes a .gguf file, llama.cpp's format; "
            "leave it unset to serve the embedded SmolLM2-135M"
        )


def load_model(path: Path, repack: Repack = "auto") -> Any:
    """The model in `path` (a llama-cpp-python `LlamaModel`: weights, vocabulary, metadata)."""
    from llama_cpp import _internals

    check_gguf(path)
    try:
        return _internals.LlamaModel(
            path_model=str(path), params=model_params(repack), verbose=False
        )
    except ValueError:  # llama.cpp says no more than "Failed to load model from file"
        raise EngineUnavailable(
            f"llama.cpp could not load {path}: the GGUF may be cut short (an interrupted "
            "download) or of an architecture this llama.cpp does not know; check the file "
            "against its source, or serve another"
        ) from None
