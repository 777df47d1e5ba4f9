"""The decode loop: one thread owns the llama.cpp context and runs every admitted request at once,
each choice in its own slot (sequence id) of the KV cache: continuous batching.

Each turn of the loop
1. runs queued calls (embeddings), drops requests whose clients went away, and admits waiting
   requests into free slots in arrival order;
2. evaluates up to `prompt_budget` prompt tokens, one aligned block per llama_decode, for the
   requests still reading their prompts, oldest first (with prefill weights, every block but a
   prompt's last on their lane, which hands the KV over: handover.py);
3. decodes one token for every generating sequence of one adapter group in a single
   llama_decode. llama.cpp applies a LoRA adapter to the whole context, so sequences under
   different adapters cannot share a call: the groups take turns, round-robin, one group per
   turn. With k groups generating, each decodes every k-th turn, whatever its size. A step
   lists its sequences in slot order: llama.cpp evaluates a batch over per-slot KV streams in
   one pass over the weights per run of consecutive sequence ids (slots 0-3 in one pass; 1, 2,
   3, 0 in two; 0, 2, 3 in two, whatever the order).

A background job (a shadow candidate's copy of a live request) takes a slot only when no live
request waits or runs, advances only while none runs, and is stopped (`Preempted`) as soon as a
live request waits for its slot: it never delays a live request by more than the step in progress.
A live request on another engine sharing the CPU (a checkpoint's, `live_elsewhere`) counts as one
here: background jobs wait for it, and running ones are stopped.

Prompt blocks and decode steps go to separate llama_decode calls so each sequence's tokens are
evaluated in the same shapes whatever runs beside them (see slots.py): batching changes no
answer and no logprob.

A failure fails only the requests it touches: an error while sampling or emitting one sequence's
token fails that request and the others in its batch go on; a failed llama_decode fails the
sequences that were in it. A failed sequence's slot forgets its cache, whose cells may no longer
match what the slot says it holds. Every job is settled exactly once, whatever fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reef.engines.base import Cancelled, Preempted
from reef.engines.llamacpp.handover import HandOverFailed, PrefillLane
from reef.engines.llamacpp.lora import Adapters
from reef.engines.llamacpp.output import ChoiceOutput, Emit, Generation
from reef.engines.llamacpp.repetition import Repetition
from reef.engines.llamacpp.sampling import SequenceSampler, logits_row, logprob_of
from reef.engines.llamacpp.slots import BLOCK, Slot, SlotTable
from reef.engines.llamacpp.structured import OutputConstraint
from reef.errors import EngineUnavailable
from reef.threads import ThreadChoice

log = logging.getLogger(__name__)

Choices = list[tuple[Generation, ChoiceOutput]]
PROMPT_BLOCK = "prompt block"  # the kind of a prompt block's llama_decode, for ThreadChoice
Settle = Callable[[Any], None]  # called once on the loop thread: a result or an exception


@dataclass
class Job:
    """One request: its checked prompt and sampling, where its chunks and result go."""

    prompt: list[int]
    sampling: Any  # sampling.Sampling
    choices_wanted: int
    chunks: Any  # base.ChunkFactory
    constraint: OutputConstraint | None
    adapter: Path | None
    emit: Emit | None
    cancel: threading.Event
    settle: Settle
    stop_loops: bool = True  # end a choice that repeats itself (see repetition.py)
    background: bool = False  # runs only on capacity no live request uses (see the module)
    choices: Choices = field(default_factory=list)
    settled: bool = False
    started_at: float | None = None  # when its first choice took a slot (perf_counter)

    def done(self, result: Any) -> None:
        """Settle the job with its choices or an exception; later calls are ignored."""
        if not self.settled:
            self.settled = True
            self.settle(result)


class _Sequence:
    """One choice of a job running in a slot."""

    def __init__(self, job: Job, slot: Slot, index: int, start: int, sampler: SequenceSampler):
        self.job, self.slot, self.index, self.sampler = job, slot, index, sampler
        self.sampling = job.sampling.for_choice(index)
        self.position = start  # the next position to evaluate
        self.next_token: int | None = None  # sampled, to be decoded next
        self.state = Generation()
        self.out = ChoiceOutput(job.chunks, job.emit, index, job.constraint)
        # An answer held to a grammar (a JSON schema, a forced tool call) is never ended as a
        # loop: cut short it would not parse. Its grammar and max_tokens bound it instead.
        watched = job.stop_loops and job.constraint is None
        self.repetition = Repetition() if watched else None

    @property
    def prefilling(self) -> bool:
        return self.position < len(self.job.prompt)

    def next_block(self) -> list[int]:
        """The prompt's next aligned block (positions start at a multiple of BLOCK)."""
        end = min(len(self.job.prompt), (self.position // BLOCK + 1) * BLOCK)
        return self.job.prompt[self.position : end]

    @property
    def at_last_block(self) -> bool:
        """Whether the next block is the prompt's last (it gives the first token's logits)."""
        return (self.position // BLOCK + 1) * BLOCK >= len(self.job.prompt)


class DecodeLoop:
    def __init__(
        self,
        model: Any,
        context: Any,
        n_slots: int,
        prompt_budget: int,
        adapters: Adapters,
        threads: ThreadChoice | None = None,
        live_elsewhere: Callable[[], bool] = lambda: False,
        lane: PrefillLane | None = None,
    ) -> None:
        import llama_cpp

        self._model = model
        self._context = context
        self._vocab = model.vocab
        self._n_vocab = model.n_vocab()
        self._scratch = np.empty(self._n_vocab, dtype=np.float32)  # logprob_of's, per token
        self._adapters = adapters
        self._lane = lane  # the prefill weights' context, if prompts are read on other weights
        # Whether a live request is in flight on an engine sharing this CPU (a checkpoint's).
        self._live_elsewhere = live_elsewhere
        self.threads = threads or ThreadChoice(1, adaptive=False)
        self._threads_set: int | None = None  # the count the context decodes with now
        self._prompt_budget = max(BLOCK, prompt_budget)
        self.slots = SlotTable(llama_cpp.llama_get_memory(context), n_slots)
        self._batch = llama_cpp.llama_batch_init(max(BLOCK, n_slots), 0, 1)
        self._waiting: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Settle]] = deque()
        self._running: list[_Sequence] = []
        self._turn = 0  # round-robin position over adapter groups
        self.loops_stopped = 0  # choices ended because they repeated themselves
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="reef-llamacpp", daemon=True)
        self._thread.start()

    # -- called from other threads ---------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self._wake:
            self._waiting.append(job)
            self._wake.notify()

    def call(self, work: Callable[[], Any], settle: Settle) -> None:
        """Run `work` on the loop thread between two turns (it owns the model's compute)."""
        with self._wake:
            self._calls.append((work, settle))
            self._wake.notify()

    def attach_lane(self, lane: PrefillLane) -> None:
        """Read prompts on `lane` from the next turn on (its copy was made while serving)."""

        def attach() -> None:
            self._lane = lane

        self.call(attach, lambda _: None)

    def close(self) -> None:
        import llama_cpp

        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        llama_cpp.llama_batch_free(self._batch)

    # -- the loop thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._closing or self._waiting or self._calls or self._running):
                    self._wake.wait()
                if self._closing:
                    break
                calls, self._calls = list(self._calls), deque()
            for work, settle in calls:
                _settle_call(work, settle)
            try:
                self._turn_once()
            except Exception as error:  # a bug here must fail the requests, not hang them
                log.exception("the llama.cpp decode loop failed a turn")
                for sequence in list(self._running):
                    self._stop(sequence, _failure(error))
        self._shut_down()

    def _turn_once(self) -> None:
        for sequence in [s for s in self._running if s.job.cancel.is_set()]:
            self._stop(sequence, Cancelled())
        self._yield_to_live()
        self._admit()
        self._prefill()
        self._decode()

    def _live_running(self) -> bool:
        return any(not s.job.background for s in self._running)

    def _advancing(self) -> list[_Sequence]:
        """The sequences this turn advances: background ones only while no live one runs."""
        if self._live_running():
            return [s for s in self._running if not s.job.background]
        return list(self._running)

    def _yield_to_live(self) -> None:
        """A live request waiting for a slot takes one from a background job; one on an engine
        beside this one stops them all."""
        with self._wake:
            live_waiting = sum(not job.background for job in self._waiting)
        background = [s for s in self._running if s.job.background]
        if not self._live_elsewhere():
            background = background[: max(0, live_waiting - self.slots.free())]
        for sequence in background:
            self._stop(sequence, Preempted())

    def _next_waiting(self) -> Job | None:
        """The oldest waiting live job; else, while no live job runs here or beside, the oldest
        background."""
        with self._wake:
            chosen = next((job for job in self._waiting if not job.background), None)
            idle = not self._live_running() and not self._live_elsewhere()
            if chosen is None and self._waiting and idle:
                chosen = self._waiting[0]
            if chosen is not None:
                self._waiting.remove(chosen)
            return chosen

    def _admit(self) -> None:
        while self.slots.free():
            job = self._next_waiting()
            if job is None:
                return
            if job.cancel.is_set():
                job.done(Cancelled())
                continue
            try:
                self._adapters.load(job.adapter)
            except Exception as error:
                job.done(error)
                continue
            self._admit_job(job)

    def _admit_job(self, job: Job) -> None:
        try:  # a failing acquire hands out no slot
            acquired = self.slots.acquire(job.prompt, job.adapter)
        except Exception as error:
            log.exception("a request could not take a llama.cpp slot")
            job.done(_failure(error))
            return
        assert acquired is not None  # a slot was free and only this thread takes them
        self._start(job, *acquired, index=0)

    def _start(self, job: Job, slot: Slot, start: int, index: int) -> None:
        """Run choice `index` of `job` in `slot`; a job that cannot start gives its slot back and
        fails (it is not yet running, so the loop's catch-all would not reach it)."""
        grammar = job.constraint.grammar if job.constraint is not None else None
        try:
            sampler = SequenceSampler(
                self._vocab, self._n_vocab, job.sampling.for_choice(index), grammar
            )
        except Exception as error:
            self.slots.release(slot)
            job.done(error)
            return
        if job.started_at is None:
            job.started_at = time.perf_counter()
        sequence = _Sequence(job, slot, index, start, sampler)
        self._running.append(sequence)
        if not sequence.prefilling:  # the slot held this very prompt, and its last logits
            assert slot.prompt_logits is not None
            self._take_or_fail(sequence, slot.prompt_logits)

    def _prefill(self) -> None:
        budget = self._prompt_budget
        for sequence in [s for s in self._advancing() if s.prefilling]:
            while sequence.prefilling and budget > 0:
                on_lane = (
                    self._lane is not None
                    and not sequence.at_last_block
                    and self._lane.holds(sequence.job.adapter)
                )
                if on_lane and not self._holds_lane(sequence):
                    break  # another prompt reads on the lane: this one waits its turn
                block = sequence.next_block()
                budget -= len(block)
                read = self._read_on_lane if on_lane else self._evaluate_block
                if not read(sequence, block):
                    return
                if sequence.job.background:
                    break  # one block a turn: a live request arriving waits for one block only
            if budget <= 0:
                return

    def _holds_lane(self, sequence: _Sequence) -> bool:
        """Whether `sequence` holds the prefill lane, taking it if it is free, or from a
        background job if `sequence` is live."""
        lane = self._lane
        assert lane is not None
        if lane.owner is sequence:
            return True
        owner = lane.owner
        if isinstance(owner, _Sequence) and owner.job.background and not sequence.job.background:
            self._stop(owner, Preempted())  # it stands still while live requests run
        if not lane.free:
            return False
        job, held_in = sequence.job, (self._context, sequence.slot.seq_id)
        try:
            lane.take(sequence, job.prompt, sequence.position, job.adapter, held_in)
        except HandOverFailed as error:
            self._give_up_lane(sequence, error)
            return False
        except Exception as error:
            self._stop(sequence, _failure(error))
            return False
        return True

    def _read_on_lane(self, sequence: _Sequence, block: list[int]) -> bool:
        """One prompt block read on the prefill lane; before the prompt's last block, the lane's
        KV is handed over to the sequence's slot, which then records what it holds."""
        lane = self._lane
        assert lane is not None
        try:
            lane.evaluate(block, sequence.position)
            sequence.position += len(block)
            if sequence.at_last_block:
                slot = sequence.slot
                lane.hand_over(self._context, slot.seq_id, len(self.slots.slots))
                slot.evaluated(sequence.job.prompt[len(slot.tokens) : sequence.position], True)
        except HandOverFailed as error:
            self._give_up_lane(sequence, error)
        except Exception as error:
            self._stop(sequence, _failure(error))
            return False
        return True

    def _give_up_lane(self, sequence: _Sequence, error: HandOverFailed) -> None:
        """The KV cache could not be moved (a llama.cpp whose state layout this code does not
        know): the served weights read every prompt from now on, this one again from its start."""
        assert self._lane is not None
        log.error("prompts are read on the served weights from now on: %s", error)
        self._lane.disabled = str(error)
        self._lane.release(sequence)
        self._lane = None
        self.slots.forget(sequence.slot)
        self.slots.distrust()  # blocks the lane read would make a continued prompt differ
        sequence.position = 0

    def _evaluate_block(self, sequence: _Sequence, block: list[int]) -> bool:
        """One llama_decode of one prompt block; samples the first token after the last block."""
        last = sequence.position + len(block) == len(sequence.job.prompt)
        tokens = [(sequence, token, sequence.position + i) for i, token in enumerate(block)]
        self._fill(tokens, outputs=False)
        self._batch.logits[len(block) - 1] = last  # only the prompt's last token is sampled
        if not self._run_decode([sequence], sequence.job.adapter, PROMPT_BLOCK):
            return False
        # With a prefill lane, the last block is read on other weights than the blocks before
        # it, and a longer prompt would read it on the lane: it is never reused.
        whole_block = len(block) == BLOCK and self._lane is None
        sequence.slot.evaluated(block, whole_block=whole_block)
        sequence.position += len(block)
        if last:
            row = logits_row(self._context, len(block) - 1, self._n_vocab)
            sequence.slot.prompt_evaluated(row)
            self._take_or_fail(sequence, row, len(block) - 1)
        return True

    def _decode(self) -> None:
        """One token for every generating sequence of the next adapter group."""
        ready = [s for s in self._advancing() if s.next_token is not None]
        if not ready:
            return
        groups = list(dict.fromkeys(s.job.adapter for s in ready))
        adapter = groups[self._turn % len(groups)]
        self._turn += 1
        # In slot order: llama.cpp evaluates a batch over per-slot KV streams in one pass per run
        # of consecutive sequence ids as listed, so slots 1, 2, 3, 0 would cost two passes.
        group = sorted((s for s in ready if s.job.adapter == adapter), key=_slot_order)
        self._fill([(s, s.next_token, s.position) for s in group])  # type: ignore[misc]
        if not self._run_decode(group, adapter, len(group)):
            return
        # Every slot records its new cell before any sequence is sampled: a failure sampling
        # one must not leave another's record behind its cache.
        for sequence in group:
            sequence.slot.evaluated([sequence.next_token], whole_block=False)  # type: ignore[list-item]
            sequence.position += 1
            sequence.next_token = None
        for index, sequence in enumerate(group):
            row = logits_row(self._context, index, self._n_vocab)
            self._take_or_fail(sequence, row, index)

    def _fill(self, tokens: list[tuple[_Sequence, int, int]], outputs: bool = True) -> None:
        """Put `tokens` (sequence, token, position) in the batch; `outputs`: logits for each."""
        batch = self._batch
        batch.n_tokens = len(tokens)
        for i, (sequence, token, position) in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence.slot.seq_id
            batch.logits[i] = outputs

    def _run_decode(self, sequences: list[_Sequence], adapter: Path | None, kind: Hashable) -> bool:
        """One llama_decode of the batch as filled, with the thread count fastest for its `kind`
        (a prompt block, or a decode step of that many sequences)."""
        import llama_cpp

        try:
            self._adapters.apply(adapter)
            count = self._use_threads(kind)
            started = time.perf_counter()
            code = llama_cpp.llama_decode(self._context, self._batch)
            self.threads.took(kind, count, time.perf_counter() - started)
            if code != 0:
                raise EngineUnavailable(f"llama.cpp could not decode a batch (code {code})")
        except Exception as error:
            for sequence in sequences:
                self._stop(sequence, error)
            return False
        return True

    def _use_threads(self, kind: Hashable) -> int:
        import llama_cpp

        count = self.threads.threads_for(kind)
        if count != self._threads_set:
            llama_cpp.llama_set_n_threads(self._context, count, count)
            self._threads_set = count
        return count

    def _take_or_fail(self, sequence: _Sequence, row: np.ndarray, index: int | None = None) -> None:
        """`_take`; an error there fails this sequence's request only."""
        try:
            self._take(sequence, row, index)
        except Exception as error:
            log.exception("a llama.cpp sequence failed; the others in its batch go on")
            self._stop(sequence, _failure(error))

    def _take(self, sequence: _Sequence, row: np.ndarray, index: int | None) -> None:
        """Sample the sequence's next token from `row`, the logits of batch output `index` (None:
        kept by its slot), and add it to its text."""
        import llama_cpp

        state, sampling = sequence.state, sequence.sampling
        if index is None:
            token = sequence.sampler.sample(row)
        else:
            token = sequence.sampler.sample(row, self._context, index)
        logprob, top = logprob_of(row, token, sampling.top_logprobs, self._scratch)
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        state.token_ids.append(token)
        state.token_logprobs.append(logprob)
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            state.finish_reason = "stop"
            return self._finish(sequence)
        piece = bytes(self._model.detokenize([token]))
        if sampling.top_logprobs is not None:
            state.logprob_content.append(self._logprob_entry(token, logprob, top))
        if state.add_piece(piece, sampling.stops):
            return self._finish(sequence)
        sequence.out.send(state, sampling.hold if sampling.stops else 0)
        if len(state.token_ids) >= sampling.max_tokens:
            state.finish_reason = "stop" if sampling.limit_is_a_stop else "length"
            return self._finish(sequence)
        if sequence.repetition is not None and sequence.repetition.looping(token):
            # Ended as a stop sequence ends an answer: "length" would make agents (Codex,
            # Claude Code) fail the call as cut short, and what follows would only repeat.
            self.loops_stopped += 1
            state.finish_reason, state.looped = "stop", True
            return self._finish(sequence)
        sequence.next_token = token

    def _finish(self, sequence: _Sequence) -> None:
        job = sequence.job
        sequence.state.flush()
        sequence.out.finish(sequence.state)
        job.choices.append((sequence.state, sequence.out))
        self._running.remove(sequence)
        sequence.sampler.close()
        index = sequence.index + 1
        if index < job.choices_wanted:  # the next choice reuses the slot's prompt cache
            start = self.slots.reuse(sequence.slot, job.prompt, job.adapter)
            self._start(job, sequence.slot, start, index)
            return
        self.slots.release(sequence.slot)
        job.done(job.choices)

    def _stop(self, sequence: _Sequence, error: BaseException) -> None:
        """End `sequence`'s request with `error`, wherever it was: running, or finishing (out
        of the running list, its slot still held). A slot whose sequence failed, rather than
        was cancelled between turns, forgets its cache."""
        if sequence in self._running:
            self._running.remove(sequence)
        if self._lane is not None:
            self._lane.release(sequence)
        sequence.sampler.close()
        if sequence.slot.busy:
            if not isinstance(error, Cancelled):
                self.slots.forget(sequence.slot)
            self.slots.release(sequence.slot)
        sequence.job.done(error)

    def _logprob_entry(
        self, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> dict[str, Any]:
        def describe(t: int, lp: float) -> dict[str, Any]:
            raw = bytes(self._model.detokenize([t]))
            return {
                "token": raw.decode("utf-8", errors="replace"),
                "logprob": lp,
                "bytes": list(raw),
            }

        return {**describe(token, logprob), "top_logprobs": [describe(t, lp) for t, lp in top]}

    def _shut_down(self) -> None:
        closed = EngineUnavailable("the llama.cpp engine is stopping")
        for sequence in list(self._running):
            self._stop(sequence, closed)
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
            calls, self._calls = list(self._calls), deque()
        for job in waiting:
            job.done(closed)
        for _, settle in calls:
            settle(closed)


def _slot_order(sequence: _Sequence) -> int:
    return sequence.slot.seq_id


def _failure(error: Exception) -> EngineUnavailable:
    """What a client is told when the engine failed its request."""
    if isinstance(error, EngineUnavailable):
        return error
    return EngineUnavailable(f"the llama.cpp engine failed this request: {error}")


def _settle_call(work: Callable[[], Any], settle: Settle) -> None:
    try:
        result = work()
    except Exception as error:
        settle(error)
        return
    settle(result)
