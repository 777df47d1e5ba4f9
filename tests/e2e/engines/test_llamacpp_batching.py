"""Batched decoding and the per-slot prompt cache on the real embedded model: batching changes
nothing a client sees, and a prompt that continues a slot's cache evaluates only what is new."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from reef.engines.llamacpp import Cancelled, LlamaCppEngine
from reef.engines.llamacpp.loop import DecodeLoop
from reef.engines.llamacpp.slots import BLOCK, SlotTable
from reef.errors import EngineUnavailable
from reef.protocol import ChatRequest, Completion
from reef.testing.artifacts import random_lora
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SEED, SMALL_ENGINE, write_config

QUESTIONS = [
    "Name three colours.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count from 1 to 10.",
]
# A long neighbour: its cache spans more cells than the others', as an agent's would.
LONG = "Summarise this text. " + "The river runs past the old mill and under the bridge. " * 40


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    loaded = LlamaCppEngine(n_ctx=1024, n_threads=2, slots=4, stop_loops=False)
    asyncio.run(loaded.start())
    yield loaded
    asyncio.run(loaded.close())


def chat(content: str, **fields: Any) -> ChatRequest:
    return ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": content}], **fields}
    )


def alone(engine: LlamaCppEngine, requests: list[ChatRequest]) -> list[Completion]:
    async def one_by_one() -> list[Completion]:
        return [await engine.complete(request) for request in requests]

    return asyncio.run(one_by_one())


def together(engine: LlamaCppEngine, requests: list[ChatRequest]) -> list[Completion]:
    async def at_once() -> list[Completion]:
        return list(await asyncio.gather(*(engine.complete(r) for r in requests)))

    return asyncio.run(at_once())


def test_batching_changes_no_answer_and_no_logprob(engine: LlamaCppEngine) -> None:
    requests = [chat(q, max_tokens=24, temperature=0) for q in [*QUESTIONS[:3], LONG]]
    sampled = [chat(QUESTIONS[3], max_tokens=24, temperature=0.9, seed=SEED + 11)]
    first = alone(engine, requests + sampled)
    batched = together(engine, requests + sampled)
    for one, other in zip(first, batched, strict=True):
        assert one.token_ids == other.token_ids
        assert one.token_logprobs == pytest.approx(other.token_logprobs, abs=1e-5)
        assert one.response["choices"][0]["message"] == other.response["choices"][0]["message"]


def test_requests_run_at_once_not_one_after_another(engine: LlamaCppEngine) -> None:
    first_token: list[float] = []
    finished: list[float] = []

    endless = {str(engine._model.token_eos()): -100}  # each runs its 16 tokens

    async def one(question: str) -> None:
        request = chat(question, max_tokens=16, temperature=0, stream=True, logit_bias=endless)
        seen = False
        async for item in engine.stream(request):
            content = isinstance(item, dict) and item["choices"] and item["choices"][0]["delta"]
            if not seen and content and content.get("content"):
                first_token.append(time.perf_counter())
                seen = True
        finished.append(time.perf_counter())

    async def burst() -> None:
        await asyncio.gather(*(one(q) for q in QUESTIONS))

    asyncio.run(burst())
    # Every request had its first token before any of them finished.
    assert len(first_token) == len(finished) == 4
    assert max(first_token) < min(finished)


def test_cancelling_one_sequence_leaves_the_others_running(engine: LlamaCppEngine) -> None:
    eos = str(engine._model.token_eos())
    endless = {"max_tokens": 40, "temperature": 0, "logit_bias": {eos: -100}}
    requests = [chat(q, **endless) for q in QUESTIONS[:3]]
    expected = alone(engine, requests)

    async def cancel_the_second() -> list[Any]:
        tasks = [asyncio.create_task(engine.complete(r)) for r in requests]
        while engine.in_flight < 3 or not engine._loop or not engine._loop._running:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(cancel_the_second())
    assert isinstance(results[1], asyncio.CancelledError | Cancelled)
    for index in (0, 2):
        assert results[index].token_ids == expected[index].token_ids
        assert len(results[index].token_ids) == 40
    assert engine.in_flight == 0


def test_a_decode_step_lists_its_sequences_in_slot_order(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp splits a batch over per-slot KV streams into one ubatch per run of consecutive
    sequence ids, in the order the batch lists them: slots 1, 2, 3, 0 would take two passes
    over the weights where 0, 1, 2, 3 take one. A first request makes one slot the most
    recently used, so four requests then take the other three first and that one last; each
    decode step must still list them in slot order."""
    import llama_cpp

    decode = llama_cpp.llama_decode
    steps: list[list[int]] = []

    def recording_decode(context: Any, batch: Any) -> int:
        ids = [batch.seq_id[i][0] for i in range(batch.n_tokens)]
        if len(set(ids)) == len(ids) > 1:  # a decode step: one token for each sequence
            steps.append(ids)
        return decode(context, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", recording_decode)
    eos = str(engine._model.token_eos())
    endless = {"max_tokens": 12, "temperature": 0, "logit_bias": {eos: -100}}
    alone(engine, [chat(QUESTIONS[0], **endless)])
    together(engine, [chat(q, **endless) for q in QUESTIONS])
    assert any(len(ids) == 4 for ids in steps)
    for ids in steps:
        assert ids == sorted(ids)


def test_a_sequence_that_fails_fails_only_its_own_request(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error sampling one sequence's token (injected here, at its sixth token) fails that
    request with a 503 error; the sequences batched with it finish as they would alone, and the
    engine then serves the failed request's prompt as before."""
    eos = str(engine._model.token_eos())
    endless = {"temperature": 0, "logit_bias": {eos: -100}}
    requests = [
        chat(QUESTIONS[0], max_tokens=40, **endless),
        chat(LONG, max_tokens=39, **endless),  # the one that fails: its cache spans blocks
        chat(QUESTIONS[2], max_tokens=40, **endless),
    ]
    expected = alone(engine, requests)
    take = DecodeLoop._take

    def failing_take(loop: DecodeLoop, sequence: Any, row: Any, index: int | None) -> None:
        if sequence.sampling.max_tokens == 39 and len(sequence.state.token_ids) == 5:
            raise RuntimeError("injected sampling failure")
        take(loop, sequence, row, index)

    monkeypatch.setattr(DecodeLoop, "_take", failing_take)

    async def all_at_once() -> list[Any]:
        tasks = [engine.complete(r) for r in requests]
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(all_at_once())
    assert isinstance(results[1], EngineUnavailable)
    assert results[1].status == 503
    assert "injected sampling failure" in results[1].message
    for index in (0, 2):
        assert results[index].token_ids == expected[index].token_ids
    assert engine.in_flight == 0
    monkeypatch.setattr(DecodeLoop, "_take", take)
    assert [c.token_ids for c in together(engine, requests)] == [c.token_ids for c in expected]


def test_a_request_that_cannot_take_a_slot_is_answered_not_left_waiting(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure handing out a slot (injected once) answers that request with a 503 error; the
    engine goes on serving the next one."""
    acquire = SlotTable.acquire
    failures = iter([RuntimeError("injected slot failure")])

    def failing_acquire(table: SlotTable, prompt: list[int], adapter: Path | None) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return acquire(table, prompt, adapter)

    monkeypatch.setattr(SlotTable, "acquire", failing_acquire)
    request = chat(QUESTIONS[1], max_tokens=8, temperature=0)

    async def twice() -> list[Any]:
        first = await asyncio.wait_for(
            asyncio.gather(engine.complete(request), return_exceptions=True), 30
        )
        return [*first, await asyncio.wait_for(engine.complete(request), 30)]

    failed, served = asyncio.run(twice())
    assert isinstance(failed, EngineUnavailable)
    assert "injected slot failure" in failed.message
    assert served.token_ids
    assert engine.in_flight == 0


def test_two_adapters_take_turns_and_each_keeps_its_answers(
    engine: LlamaCppEngine, tmp_path: Path
) -> None:
    """Sequences under different LoRA adapters cannot share a llama_decode: the groups alternate,
    one decode each in turn. Neither waits for the other to finish, and each answers as alone."""
    lora = random_lora(tmp_path / "lora")
    eos = str(engine._model.token_eos())
    endless = {"max_tokens": 32, "temperature": 0, "logit_bias": {eos: -100}, "stream": True}
    request = chat(QUESTIONS[0], **endless)  # the same request, with and without the adapter

    async def streamed(adapter: Path | None) -> tuple[list[float], Completion]:
        times, completion = [], None
        async for item in engine.stream(request, adapter=adapter):
            if isinstance(item, Completion):
                completion = item
            elif item["choices"] and item["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
        assert completion is not None
        return times, completion

    async def alone_then_together() -> tuple[list[Any], list[Any]]:
        solo = [await streamed(None), await streamed(lora)]
        return solo, list(await asyncio.gather(streamed(None), streamed(lora)))

    solo, together = asyncio.run(alone_then_together())
    assert solo[0][1].token_ids != solo[1][1].token_ids  # the adapter changes the answer
    for (_, one), (_, other) in zip(solo, together, strict=True):
        assert len(other.token_ids) == 32
        assert other.token_ids == one.token_ids
        assert other.token_logprobs == pytest.approx(one.token_logprobs, abs=1e-5)
    # Taking turns: when either group has its last token, the other has most of its own.
    (base_times, _), (lora_times, _) = together
    first_done = min(base_times[-1], lora_times[-1])
    assert sum(t <= first_done for t in base_times) >= len(base_times) * 3 // 4
    assert sum(t <= first_done for t in lora_times) >= len(lora_times) * 3 // 4


def test_a_seed_keeps_the_prompt_cache(engine: LlamaCppEngine) -> None:
    request = chat(LONG, max_tokens=8, temperature=1.0, seed=SEED + 1234)
    first = alone(engine, [request])[0]
    before = engine.cache_counters["reused_tokens"]
    again = alone(engine, [request])[0]
    reused = engine.cache_counters["reused_tokens"] - before
    assert reused == len(first.prompt_token_ids or []) > BLOCK  # the last partial block too
    assert again.token_ids == first.token_ids


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0},  # numpy's argmax
        {"temperature": 0, "presence_penalty": 0.5},  # llama.cpp's chain, greedy
        {"temperature": 1.0, "seed": SEED + 77},  # the chain's seeded draw
        {"temperature": 1.0, "seed": SEED + 78, "response_format": {"type": "json_object"}},
    ],
    ids=["greedy", "penalised", "seeded", "grammar"],
)
def test_a_prompt_sent_again_evaluates_nothing_and_answers_as_cold(
    engine: LlamaCppEngine, sampling: dict[str, Any]
) -> None:
    """The slot keeps the logits of its prompt's last token: the same prompt again samples its
    first token from them, through the same sampler, and gets the cold answer bit for bit."""
    request = chat(
        f"{sorted(sampling)} {sampling.get('seed')}: name a colour.",
        max_tokens=12,
        logprobs=True,
        **sampling,
    )
    cold = alone(engine, [request])[0]
    prompt = len(cold.prompt_token_ids or [])
    assert prompt % BLOCK  # a partial last block, which only the kept logits let it reuse
    before = engine.cache_counters["reused_tokens"]
    again = alone(engine, [request])[0]
    assert engine.cache_counters["reused_tokens"] - before == prompt
    assert again.token_ids == cold.token_ids
    assert again.token_logprobs == pytest.approx(cold.token_logprobs, abs=1e-5)


def test_a_conversation_resent_with_one_more_message_evaluates_only_the_new_tokens(
    engine: LlamaCppEngine,
) -> None:
    agents = {
        name: [{"role": "user", "content": f"I am agent {name}. " + LONG}] for name in ("a", "b")
    }
    first_turns = {}
    for name, messages in agents.items():  # two agents interleaved, each in its own slot
        reply = alone(engine, [ChatRequest(messages=messages, max_tokens=16, temperature=0)])[0]
        first_turns[name] = reply
        messages.append(reply.response["choices"][0]["message"])
        messages.append({"role": "user", "content": "And in one word?"})
    for name, messages in agents.items():
        before = dict(engine.cache_counters)
        second = alone(engine, [ChatRequest(messages=messages, max_tokens=4, temperature=0)])[0]
        reused = engine.cache_counters["reused_tokens"] - before["reused_tokens"]
        evaluated = len(second.prompt_token_ids or []) - reused
        first_prompt = len(first_turns[name].prompt_token_ids or [])
        assert reused >= first_prompt - BLOCK, (name, reused, first_prompt)
        assert evaluated < BLOCK + 16 + 20  # the last partial block, the reply, the question


def test_choices_share_the_slot_cache_and_keep_their_own_seeds(engine: LlamaCppEngine) -> None:
    request = chat(QUESTIONS[2], n=3, max_tokens=10, temperature=1.0, seed=SEED + 5)
    [result] = alone(engine, [request])
    texts = [choice["message"]["content"] for choice in result.response["choices"]]
    assert [c["index"] for c in result.response["choices"]] == [0, 1, 2]
    singles = [
        alone(engine, [chat(QUESTIONS[2], max_tokens=10, temperature=1.0, seed=s)])[0]
        for s in (SEED + 5, SEED + 6, SEED + 7)
    ]
    assert texts == [s.response["choices"][0]["message"]["content"] for s in singles]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("batching")
    write_config(folder, SMALL_ENGINE)
    with reef_serve(folder, free_port()).start() as running:
        yield running


def test_a_stream_and_a_whole_response_share_the_batch(server: ServerProcess) -> None:
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    eos = str(_eos_token())
    whole_body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count from one to a thousand in words."}],
        "max_tokens": 120,
        "temperature": 0,
        "logit_bias": {eos: -100},
    }
    stream_body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "max_tokens": 12,
        "temperature": 0,
    }
    expected_stream = client.chat.completions.create(**stream_body).choices[0].message.content
    finished: dict[str, float] = {}
    whole: list[Any] = []

    def run_whole() -> None:
        whole.append(client.chat.completions.create(**whole_body))
        finished["whole"] = time.monotonic()

    runner = threading.Thread(target=run_whole)
    runner.start()
    time.sleep(0.5)
    pieces = []
    for chunk in client.chat.completions.create(**stream_body, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    finished["stream"] = time.monotonic()
    runner.join()
    assert "".join(pieces) == expected_stream
    assert whole[0].usage.completion_tokens == 120
    assert finished["stream"] < finished["whole"]  # it did not wait for the long one


def _eos_token() -> int:
    probe = LlamaCppEngine(n_ctx=256, n_threads=1, slots=1)
    asyncio.run(probe.start())
    try:
        return int(probe._model.token_eos())
    finally:
        asyncio.run(probe.close())


def test_retry_after_counts_the_time_a_request_holds_a_slot_not_its_wait() -> None:
    """With one slot, the second of two requests waits for the first to finish: its clock for
    Retry-After starts when it takes the slot, so the average is a request's service time and
    does not grow with the queue in front of it."""
    single = LlamaCppEngine(n_ctx=512, n_threads=2, slots=1, stop_loops=False)
    asyncio.run(single.start())
    jobs: list[Any] = []
    finished: list[float] = []
    make_job = single._job

    def recorded_job(*args: Any) -> Any:
        job = make_job(*args)
        settle = job.settle

        def settled(result: Any) -> None:
            finished.append(time.perf_counter())
            settle(result)

        job.settle = settled
        jobs.append(job)
        return job

    single._job = recorded_job  # type: ignore[method-assign]
    request = chat(QUESTIONS[0], max_tokens=8, temperature=0)

    async def two_at_once() -> None:
        await asyncio.gather(single.complete(request), single.complete(request))

    try:
        asyncio.run(two_at_once())
    finally:
        asyncio.run(single.close())
    second = max(jobs, key=lambda job: job.started_at)
    assert second.started_at >= min(finished)  # it took the slot only once the first was done
    # And the average moves toward the time a job held its slot, counted from `started_at`.
    single._seconds_per_request = 1.0
    second.started_at = time.perf_counter() - 3.0
    single._served(second)
    assert single._seconds_per_request == pytest.approx(0.8 * 1.0 + 0.2 * 3.0, abs=0.01)
