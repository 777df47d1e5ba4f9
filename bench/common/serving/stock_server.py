"""`python -m bench.common.serving.stock_server ARGS…`: the stock `llama_cpp.server` with ARGS, on
the
weight kernels Reef uses on this machine. `servers.stock_llama_server` starts it by its file path
(for the serving benchmark, `bench/speed/laptop.py` and `bench/speed/batching.py`).

llama-cpp-python's server has no `--no-repack` flag, and the llama.cpp it pins crashes in its AMX
kernels where a build has them (see src/reef/engines/llamacpp_weights.py). This launcher gives its
model loads Reef's repack rule before the server starts, so the baseline runs at all on such a
build, and both sides of a benchmark run the same kernels everywhere.
"""

from __future__ import annotations

import runpy
import sys

import llama_cpp.llama_cpp as bindings  # where llama_cpp.Llama reads its model defaults

from reef.engines.llamacpp.weights import repacks

REPACK = repacks("auto")
_default_params = bindings.llama_model_default_params


def model_default_params() -> bindings.llama_model_params:
    params = _default_params()
    params.use_extra_bufts = REPACK
    return params


if __name__ == "__main__":
    bindings.llama_model_default_params = model_default_params
    sys.argv = ["llama_cpp.server", *sys.argv[1:]]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
