"""LoRA adapters on the llama.cpp context: loaded once and kept while their releases serve.

llama.cpp applies adapters to a whole context, so the decode loop sets the adapter of the group
it decodes before each call; switching is a pointer swap, not a reload. Loaded adapters are kept
(the most recently used `MAX_LOADED`), so scenarios serving different LoRA releases alternate
without reading adapter files again.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from pathlib import Path
from typing import Any

from reef.artifacts import ADAPTER, folder_files
from reef.errors import EngineUnavailable, Unsupported

MAX_LOADED = 8

_UNSET = object()


class Adapters:
    def __init__(self, model: Any, context: Any) -> None:
        self._model = model
        self._context = context
        self._loaded: OrderedDict[Path, Any] = OrderedDict()
        self._applied: object = _UNSET  # the adapter path set on the context (None: base model)

    def load(self, adapter: Path | None) -> None:
        """Load `adapter` now (raising if llama.cpp cannot), so a request fails before it runs."""
        if adapter is not None:
            self._pointer(adapter)

    def apply(self, adapter: Path | None) -> None:
        """Serve the next llama_decode with `adapter` (None: the base model)."""
        import llama_cpp

        if adapter == self._applied:
            return
        if adapter is None:
            failed = llama_cpp.llama_set_adapters_lora(self._context, None, 0, None)
        else:
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._pointer(adapter))
            scales = (ctypes.c_float * 1)(1.0)
            failed = llama_cpp.llama_set_adapters_lora(self._context, adapters, 1, scales)
        if failed:
            raise EngineUnavailable(f"llama.cpp could not apply the LoRA adapter {adapter}")
        self._applied = adapter

    def close(self) -> None:
        import llama_cpp

        if self._loaded:
            llama_cpp.llama_set_adapters_lora(self._context, None, 0, None)
        for pointer in self._loaded.values():
            llama_cpp.llama_adapter_lora_free(pointer)
        self._loaded.clear()
        self._applied = _UNSET

    def _pointer(self, adapter: Path) -> Any:
        import llama_cpp

        if adapter in self._loaded:
            self._loaded.move_to_end(adapter)
            return self._loaded[adapter]
        gguf = gguf_adapter(adapter)
        pointer = llama_cpp.llama_adapter_lora_init(self._model, str(gguf).encode())
        if not pointer:
            raise EngineUnavailable(f"llama.cpp could not load the LoRA adapter {adapter}")
        self._loaded[adapter] = pointer
        self._evict()
        return pointer

    def _evict(self) -> None:
        import llama_cpp

        while len(self._loaded) > MAX_LOADED:
            path, pointer = next(iter(self._loaded.items()))
            if path == self._applied:
                llama_cpp.llama_set_adapters_lora(self._context, None, 0, None)
                self._applied = None
            del self._loaded[path]
            llama_cpp.llama_adapter_lora_free(pointer)


def gguf_adapter(folder: Path) -> Path:
    if folder.is_file():
        return folder
    found = [path for path in folder_files(folder, ADAPTER) if path.suffix == ".gguf"]
    if not found:
        raise Unsupported(f"LoRA artifact {folder} has no .gguf adapter, which llama.cpp needs")
    return found[0]
