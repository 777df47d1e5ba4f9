"""Prompts read on prefill weights, decoded on the shipped ones, against today's engine (issue 63).

    .venv/bin/python -m bench.speed.prefill_handover [--rounds 3] [--parts speed answers kv]

In one run, Reef's engine as it serves (4 slots, threads chosen per block) with
`prefill_weights: same` (the baseline: today's engine, every token on the shipped Q4_1) and
`auto` (the copy `auto` chose, BF16 or F32, reads the prompt: handover.py), each in a process
of its own:

- **speed**: seconds to the first token of a cold 2,000- and 4,600-token prompt (pi's first
  request is 4,600), an agent's next turn (the 4,600 cached and 300 new tokens), decode
  tokens/s, and the gate's evaluation (the twelve probes of `reef model prepare`, one after
  another); with `auto`'s split of the 4,600-token prompt: reading on the lane, moving KV, the
  rest (the last block on Q4_1, sampling);
- **answers**: each probe behind a coding agent's long system prompt, greedy, 32 tokens: the first
  token's log-probability under each (where both chose the same first token; the others are
  counted), and the answers compared token by token. The tolerance
  is Q4_1's own spread: the same prompts read by llama.cpp in its server's 512-token batches
  instead of the engine's 64-token blocks, on the same weights;
- **the KV handed over**: one prompt's keys and values per layer, every block read on the BF16
  copy and handed over (the engine reads the last block on Q4_1, so the figure bounds its
  error from above), against a prefill on the decoding weights (relative error), beside Q4_1's own
  512-token batches against its 64-token blocks; and both reads against the weights computed
  exactly (an F32 copy of the Q4_1 file on the lane).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common.processes import in_own_process
from bench.common.prompts import WORDS, conversation
from bench.common.results import OUT

SETTINGS = ("same", "auto")
PARTS = ["speed", "answers", "kv"]
ANSWER_TOKENS = 32
NEXT_TURN_WORDS = 240  # about 300 new tokens in an agent's next turn


def _request(messages: list[dict[str, str]], max_tokens: int) -> Any:
    from reef.protocol import ChatRequest

    return ChatRequest.model_validate(
        {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    )


def _user(text: str, max_tokens: int) -> Any:
    return _request([{"role": "user", "content": text}], max_tokens)


def _system_prompt() -> str:
    """A coding agent's long system prompt of tool rules (fixed text, the same at any commit)."""
    return conversation("pi")[0]["content"]


def _engine(setting: str) -> Any:
    from llama_cpp import _logger

    from reef.engines.llamacpp.engine import LlamaCppEngine

    _logger.set_verbose(False)
    return LlamaCppEngine(n_ctx=6144, n_threads=2, stop_loops=False, prefill_weights=setting)


def speed(setting: str, rounds: int) -> dict[str, float]:
    """One engine's timings, the best of `rounds` each."""

    async def measure() -> dict[str, float]:
        engine = _engine(setting)
        await engine.start()
        try:
            await engine.complete(_user("Hi", 2))  # weights paged in
            found = {"decode_tokens_per_s": await _decode_rate(engine, rounds)}
            found["gate_probes_s"] = await _probes_seconds(engine, rounds)
            for tokens in (2000, 4600):
                found.update(await _cold_prompt(engine, tokens, rounds))
            found["next_turn_s"] = await _next_turn(engine, rounds)
            found["decode_after_tokens_per_s"] = await _decode_rate(engine, rounds)
            return found
        finally:
            await engine.close()

    return asyncio.run(measure())


async def _decode_rate(engine: Any, rounds: int) -> float:
    """Tokens/s of 128 tokens decoded after a cached prompt, the best of `rounds`."""
    count = "Count from 1 to 500, separated by commas."
    await engine.complete(_user(count, 1))
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        done = await engine.complete(_user(count, 128))
        best = max(best, (done.usage or {})["completion_tokens"] / (time.perf_counter() - started))
    return best


async def _probes_seconds(engine: Any, rounds: int) -> float:
    """Seconds for the twelve probes one after another (short prompts, 16 tokens each)."""
    best = float("inf")
    for round_ in range(rounds):
        started = time.perf_counter()
        for probe in _probes():
            await engine.complete(_user(f"{round_}. {probe}", 16))
        best = min(best, time.perf_counter() - started)
    return best


async def _cold_prompt(engine: Any, tokens: int, rounds: int) -> dict[str, float]:
    """Seconds to the first token of a `tokens`-long prompt no slot holds, and the lane's split
    of the best round."""
    found: dict[str, float] = {f"prompt_{tokens}_s": float("inf")}
    for round_ in range(rounds):
        text = " ".join([f"{tokens}-{round_}", *WORDS[: tokens - 40]])
        before = dict(engine.prefill)
        started = time.perf_counter()
        await engine.complete(_user(text, 1))
        seconds = time.perf_counter() - started
        if seconds < found[f"prompt_{tokens}_s"]:
            after = engine.prefill
            found[f"prompt_{tokens}_s"] = seconds
            found[f"reading_{tokens}_s"] = after["reading_s"] - before["reading_s"]
            found[f"moving_{tokens}_s"] = after["moving_s"] - before["moving_s"]
    return found


async def _next_turn(engine: Any, rounds: int) -> float:
    """An agent's next turn: the last 4,600-token prompt cached, about 300 tokens added."""
    text = " ".join([f"4600-{rounds - 1}", *WORDS[: 4600 - 40]])
    best = float("inf")
    for round_ in range(rounds):
        more = " ".join([f"turn {round_}", *WORDS[:NEXT_TURN_WORDS]])
        started = time.perf_counter()
        await engine.complete(_user(text + " " + more, 1))
        best = min(best, time.perf_counter() - started)
    return best


def _probes() -> tuple[str, ...]:
    from reef.engines.llamacpp.prepare import PROBES

    return PROBES


def answers(setting: str) -> list[dict[str, Any]]:
    """Each probe behind the long system prompt: the prompt's tokens and the greedy answer."""

    async def run() -> list[dict[str, Any]]:
        engine = _engine(setting)
        await engine.start()
        try:
            found = []
            system = _system_prompt()
            for probe in _probes():
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": probe},
                ]
                done = await engine.complete(_request(messages, ANSWER_TOKENS))
                found.append(
                    {
                        "prompt": done.prompt_token_ids,
                        "tokens": done.token_ids,
                        "logprobs": done.token_logprobs,
                    }
                )
            return found
        finally:
            await engine.close()

    return asyncio.run(run())


def first_logprob_in_batches(prompts: list[list[int]], batch: int) -> list[float]:
    """The top token's log-probability after each prompt, read by llama.cpp on the shipped
    weights in `batch`-token batches with the engine's cache types."""
    from reef.engines.llamacpp import embedded_model_path
    from reef.engines.llamacpp.context import batch_context
    from reef.engines.llamacpp.weights import load_model

    model = load_model(embedded_model_path())
    found = []
    for prompt in prompts:
        context = batch_context(model, 6144, 1, 2, batch=batch)
        logits = _read(context, prompt, batch, seq_id=0)
        shifted = logits.astype(np.float64) - logits.max()
        found.append(float(-np.log(np.exp(shifted).sum())))  # the top token's log-softmax
        context.close()
    model.close()
    return found


def _read(context: Any, tokens: list[int], block: int, seq_id: int) -> np.ndarray:
    """`tokens` read into `seq_id` in `block`-token batches; the last token's logits."""
    import llama_cpp

    from reef.engines.llamacpp.context import read_blocks

    read_blocks(context.ctx, tokens, block, seq_id)
    n_vocab = llama_cpp.llama_vocab_n_tokens(
        llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(context.ctx))
    )
    pointer = llama_cpp.llama_get_logits_ith(context.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).copy()


def kv_errors(tokens: int) -> dict[str, float]:
    """One prompt's keys and values read several ways, each against a reference read: the
    largest relative error over layers, keys and values."""
    from bench.common.formats import format_copies
    from reef.engines.llamacpp.context import batch_context
    from reef.engines.llamacpp.handover import PrefillLane
    from reef.engines.llamacpp.slots import BLOCK
    from reef.engines.llamacpp.weights import load_model
    from reef.threads import ThreadChoice

    paths = format_copies(["bf16", "f32"], shipped="q4_1")
    served = load_model(paths["q4_1"])
    prompt = served.tokenize(" ".join(WORDS).encode(), add_bos=True, special=False)[:tokens]
    decoding = batch_context(served, 6144, 4, 2)
    _read(decoding, prompt, BLOCK, seq_id=0)  # the engine's read on Q4_1 (today's)
    batched = batch_context(served, 6144, 4, 2, batch=512)
    _read(batched, prompt, 512, seq_id=0)  # Q4_1's own spread: llama-server's batches
    read = {
        "q4_1": _kv(_state(decoding.ctx, 0)),
        "q4_1 in 512-token batches": _kv(_state(batched.ctx, 0)),
    }
    for seq_id, kind in enumerate(("bf16", "f32"), start=1):
        model = load_model(paths[kind])
        context = batch_context(model, 6144, 1, 2)
        lane = PrefillLane(paths[kind], model, context, ThreadChoice(2, adaptive=False))
        lane.take("bench", prompt, 0, None, (decoding.ctx, seq_id))
        for offset in range(0, len(prompt), BLOCK):
            lane.evaluate(prompt[offset : offset + BLOCK], offset)
        lane.hand_over(decoding.ctx, seq_id, 4)
        read[f"handed over from {kind}"] = _kv(_state(decoding.ctx, seq_id))
        lane.close()
    pairs = {
        "q4_1 in 512-token batches, against q4_1": ("q4_1 in 512-token batches", "q4_1"),
        "handed over from bf16, against q4_1": ("handed over from bf16", "q4_1"),
        "q4_1, against its weights exactly (f32)": ("q4_1", "handed over from f32"),
        "handed over from bf16, against f32": ("handed over from bf16", "handed over from f32"),
    }
    return {name: _relative(read[a], read[b]) for name, (a, b) in pairs.items()}


def _state(context: Any, seq_id: int) -> bytearray:
    import ctypes

    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size(context, seq_id)
    state = bytearray(size)
    llama_cpp.llama_state_seq_get_data(
        context, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id
    )
    return state


def _relative(found: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest, over layers and K/V, of ||found - reference|| / ||reference||."""
    return max(
        float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))
        for a, b in zip(found, reference, strict=True)
    )


def _kv(state: bytearray) -> list[np.ndarray]:
    """Keys (q8_0 rows, dequantized) and values (f16, transposed) of every layer, read from a
    one-sequence state as llama.cpp 0.3.x writes it (8 bytes, streams, cells, then data)."""
    (streams,) = struct.unpack_from("<I", state, 8)
    offset = 12
    cells = 0
    for _ in range(streams):
        (cells,) = struct.unpack_from("<I", state, offset)
        offset += 4
        if cells:
            break
    for _ in range(cells):  # position, sequence count, sequence ids
        _, count = struct.unpack_from("<iI", state, offset)
        offset += 8 + 4 * count
    v_trans, layers = struct.unpack_from("<II", state, offset)
    offset += 8
    arrays = []
    for _ in range(layers):  # keys: type, row size, rows
        _, row = struct.unpack_from("<iQ", state, offset)
        offset += 12
        blocks = np.frombuffer(state, np.uint8, cells * row, offset).reshape(-1, 34)
        scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        values = blocks[:, 2:].view(np.int8).astype(np.float32)
        arrays.append((scales * values).ravel())
        offset += cells * row
    for _ in range(layers):  # values, transposed: type, element size, width, then columns
        _, size, width = struct.unpack_from("<iII", state, offset)
        offset += 12
        arrays.append(np.frombuffer(state, np.float16, cells * width, offset).astype(np.float32))
        offset += cells * width * size
    assert v_trans == 1 and offset <= len(state), "a state layout this bench does not read"
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    args = parser.parse_args()
    console = Console()
    results: dict[str, Any] = {}
    if "speed" in args.parts:
        timings = {s: in_own_process(speed, s, args.rounds) for s in SETTINGS}
        results["speed"] = timings
        _print_speed(console, timings)
    if "answers" in args.parts:
        runs = {s: in_own_process(answers, s) for s in SETTINGS}
        prompts = [run["prompt"] for run in runs["same"]]
        batched = in_own_process(first_logprob_in_batches, prompts, 512)
        results["answers"] = _print_answers(console, runs, batched)
    if "kv" in args.parts:
        results["kv"] = in_own_process(kv_errors, 2000)
        console.print(
            "the KV cache of a 2,000-token prompt, the largest relative error over layers, "
            "keys and values:"
        )
        for name, error in results["kv"].items():
            console.print(f"  {name}: {error:.4f}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prefill_handover.json").write_text(json.dumps(results, indent=2))


def _print_speed(console: Console, timings: dict[str, dict[str, float]]) -> None:
    same, auto = timings["same"], timings["auto"]
    table = Table(
        title="Reef's engine, 2 threads: same (today) against auto (a copy reads prompts)"
    )
    for column in ("", "same", "auto", "speed-up"):
        table.add_column(column, justify="right")
    rows = [
        ("2,000-token prompt, s", "prompt_2000_s", True),
        ("4,600-token prompt, s (pi's first request)", "prompt_4600_s", True),
        ("next turn: 4,600 cached + 300 new, s", "next_turn_s", True),
        ("decode, tokens/s (fresh)", "decode_tokens_per_s", False),
        ("decode, tokens/s (after the long prompts)", "decode_after_tokens_per_s", False),
        ("the 12 gate probes, s", "gate_probes_s", True),
    ]
    for label, key, lower_is_better in rows:
        ratio = same[key] / auto[key] if lower_is_better else auto[key] / same[key]
        table.add_row(label, f"{same[key]:.2f}", f"{auto[key]:.2f}", f"{ratio:.2f}x")
    console.print(table)
    total = auto["prompt_4600_s"]
    reading, moving = auto["reading_4600_s"], auto["moving_4600_s"]
    console.print(
        f"auto's 4,600-token prompt: {reading:.2f} s reading on the copy, {moving:.3f} s moving "
        f"KV, {total - reading - moving:.2f} s the rest (the last block on Q4_1, sampling)"
    )


def _print_answers(
    console: Console, runs: dict[str, list[dict[str, Any]]], batched: list[float]
) -> dict[str, Any]:
    same, auto = runs["same"], runs["auto"]
    # Over the probes whose first token both read the same: elsewhere the two figures are two
    # tokens' log-probabilities, and the disagreement is counted instead.
    pairs = list(zip(same, auto, strict=True))
    moved = [abs(a["logprobs"][0] - s["logprobs"][0]) for s, a in pairs if _first_agrees(s, a)]
    spread = [abs(b - s["logprobs"][0]) for s, b in zip(same, batched, strict=True)]
    identical = sum(s["tokens"] == a["tokens"] for s, a in zip(same, auto, strict=True))
    agreeing = [_common(s["tokens"], a["tokens"]) for s, a in zip(same, auto, strict=True)]
    summary = {
        "first_logprob_moved_mean": float(np.mean(moved)) if moved else None,
        "first_logprob_moved_max": float(np.max(moved)) if moved else None,
        "first_tokens_differing": len(pairs) - len(moved),
        "q4_1_spread_mean": float(np.mean(spread)),
        "q4_1_spread_max": float(np.max(spread)),
        "answers_identical": identical,
        "answers": len(same),
        "tokens_agreeing": agreeing,
        "prompt_tokens": [len(s["prompt"]) for s in same],
    }
    console.print(
        f"answers to prompts of {min(summary['prompt_tokens'])} to "
        f"{max(summary['prompt_tokens'])} tokens (a coding agent's system prompt, then the "
        f"probe), greedy, {ANSWER_TOKENS} tokens:\n"
        f"  first token's log-probability moved by auto, where both chose the same first token: "
        f"mean {np.mean(moved or [np.nan]):.4f}, max {np.max(moved or [np.nan]):.4f} nats "
        f"({len(pairs) - len(moved)} of {len(pairs)} chose another first token)\n"
        f"  Q4_1's own spread (512-token batches against 64-token blocks): mean "
        f"{summary['q4_1_spread_mean']:.4f}, max {summary['q4_1_spread_max']:.4f} nats\n"
        f"  identical answers: {identical} of {len(same)}; tokens agreeing before the first "
        f"difference: {agreeing}"
    )
    return summary


def _first_agrees(same: dict[str, Any], auto: dict[str, Any]) -> bool:
    return bool(same["tokens"]) and bool(auto["tokens"]) and same["tokens"][0] == auto["tokens"][0]


def _common(first: list[int], second: list[int]) -> int:
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count


if __name__ == "__main__":
    main()
