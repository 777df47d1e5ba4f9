"""How long an answer may run: the scenario's cap on max_tokens, and the end of an answer that
repeats itself, on the real engine (and, for the cap's default, the upstream engine)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.engines.llamacpp import LlamaCppEngine
from reef.engines.llamacpp.repetition import Repetition
from reef.protocol import ChatRequest
from reef.server.reef_api.harness import announced_max_tokens
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SMALL_ENGINE, embedded_vocabulary, endless, token_of, write_config

ASK = [{"role": "user", "content": "Tell me about the sea."}]


def first_loop(tokens: list[int]) -> int | None:
    """The index of the token at which a fresh `Repetition` says the answer loops."""
    watch = Repetition()
    return next((i for i, token in enumerate(tokens) if watch.looping(token)), None)


def test_a_repeated_block_is_caught_once_its_repeats_cover_64_tokens_and_three_blocks() -> None:
    opening = list(range(1000, 1040))  # 40 distinct tokens before the loop starts
    assert first_loop(opening + [7] * 100) == 40 + 63  # one token, said 64 times
    phrase = list(range(500, 510))
    assert first_loop(opening + phrase * 20) == 40 + 63  # ten tokens, 6.4 times
    sentence = list(range(600, 640))
    assert first_loop(opening + sentence * 5) == 40 + 119  # forty tokens, three times
    assert first_loop(opening + sentence * 2 + [1, 2, 3]) is None  # twice is not a loop
    almost = [*phrase[:-1], 99] * 2 + phrase * 8  # counted from where the repeats became exact
    assert first_loop(almost) == 30 + 53  # 54 exact repeats after the last 99, and a block


def test_natural_text_never_looks_like_a_loop() -> None:
    """Thousands of tokens of prose, lists and code (this project's docs) are never a loop."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("architecture.md", "configuration.md", "recipes.md"):
        text = (docs / name).read_bytes()
        tokens = embedded_vocabulary().tokenize(text, add_bos=False, special=False)
        assert len(tokens) > 2000
        assert first_loop(list(tokens)) is None, name


@pytest.fixture(scope="module")
def looping_engine() -> Iterator[LlamaCppEngine]:
    engine = LlamaCppEngine(n_ctx=1024, n_threads=2, slots=1)
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.close())


@pytest.mark.e2e  # llama.cpp's own decoding loop, on the real model
def test_the_engine_ends_an_answer_that_repeats_itself(looping_engine: LlamaCppEngine) -> None:
    """A logit bias makes the model say one word forever, by construction."""
    forever = {token_of(" sea"): 100}
    request = ChatRequest(messages=ASK, max_tokens=200, temperature=0, logit_bias=forever)
    before = looping_engine.loops_stopped
    stopped = asyncio.run(looping_engine.complete(request))
    assert len(stopped.token_ids or []) == 64
    assert stopped.response["choices"][0]["finish_reason"] == "stop"  # agents take it whole
    assert stopped.response["choices"][0]["reef"] == {"ended_by": "repetition"}
    assert stopped.looped and not stopped.ended_itself  # a learner does not take it whole
    assert looping_engine.loops_stopped == before + 1
    looping_engine.stop_loops = False
    try:
        free = asyncio.run(looping_engine.complete(request))
    finally:
        looping_engine.stop_loops = True
    assert len(free.token_ids or []) == 200
    assert "reef" not in free.response["choices"][0] and not free.looped
    assert free.token_ids[:64] == stopped.token_ids  # type: ignore[index]


@pytest.mark.e2e
def test_an_answer_held_to_a_schema_is_never_ended_as_a_loop(
    looping_engine: LlamaCppEngine,
) -> None:
    """The same forced word inside a JSON string: ended at its 64th repeat, the answer would not
    parse; the schema's maxLength closes the string instead."""
    schema = {
        "type": "object",
        "properties": {"hint": {"type": "string", "maxLength": 300}},
        "required": ["hint"],
        "additionalProperties": False,
    }
    request = ChatRequest.model_validate(
        {
            "messages": ASK,
            "max_tokens": 200,
            "temperature": 0,
            "logit_bias": {token_of(" sea"): 100},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "h", "schema": schema},
            },
        }
    )
    before = looping_engine.loops_stopped
    answer = asyncio.run(looping_engine.complete(request))
    hint = json.loads(answer.response["choices"][0]["message"]["content"])["hint"]
    assert hint.count("sea") > 64 and len(hint) <= 300
    assert not answer.looped and looping_engine.loops_stopped == before


CAPPED = SMALL_ENGINE + "generation:\n  max_tokens: 8\nscenarios:\n  long:\n    generation:\n"
CAPPED += "      max_tokens: 12\n"


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("capped")
    write_config(folder, CAPPED)
    with reef_serve(folder, free_port()).start() as server:
        yield server


def chat(server: ServerProcess, scenario: str, **fields: object) -> httpx.Response:
    body = {"messages": ASK, "temperature": 0, **endless(), **fields}
    headers = {"x-reef-scenario": scenario}
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize(
    ("scenario", "asked", "served", "finish"),
    [
        # An agent's thousands, held to the cap, which ends the answer as a stop would: the
        # client's own limit was not reached (and agents fail a call that ends "length").
        ("default", {"max_tokens": 5000}, 8, "stop"),
        ("default", {"max_completion_tokens": 5000}, 8, "stop"),
        ("default", {}, 8, "stop"),  # nothing asked: the cap, not the engine's default of 1024
        ("default", {"max_tokens": 5}, 5, "length"),  # less than the cap: as asked
        ("long", {"max_tokens": 5000}, 12, "stop"),  # the scenario's own cap
    ],
)
def test_each_scenario_caps_what_an_answer_may_run_to(
    capped: ServerProcess, scenario: str, asked: dict, served: int, finish: str
) -> None:
    response = chat(capped, scenario, **asked)
    answer = response.json()
    assert answer["usage"]["completion_tokens"] == served
    assert answer["choices"][0]["finish_reason"] == finish
    record_id = response.headers["x-reef-agent-record-id"]
    record = httpx.get(f"{capped.url}/reef/records/{record_id}").json()
    assert {k: record["request"].get(k) for k in asked} == asked  # kept as the client sent it


def test_a_stream_is_capped_too(capped: ServerProcess) -> None:
    body = {"messages": ASK, "max_tokens": 5000, "stream": True, **endless()}
    url = f"{capped.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        chunks = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: {")
        ]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"
    assert sum(bool(c["choices"] and c["choices"][0]["delta"].get("content")) for c in chunks) <= 8


def test_agents_are_told_the_cap_within_the_harnesses_own_limit() -> None:
    assert announced_max_tokens({}, 1024) == 1024
    assert announced_max_tokens({"max_tokens": 256}, 1024) == 256
    assert announced_max_tokens({"max_tokens": 4096}, 1024) == 1024
    assert announced_max_tokens({}, None) == 1024  # upstream: no cap, the usual announcement


def test_the_cap_defaults_to_none_upstream_so_the_clients_bytes_go_as_sent(
    peer: ServerProcess, tmp_path: Path
) -> None:
    write_config(tmp_path, f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n")
    with reef_serve(tmp_path, free_port()).start() as server:
        sent = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50000}'
        headers = {"content-type": "application/json"}
        url = f"{server.url}/v1/chat/completions"
        reply = httpx.post(url, content=sent, headers=headers, timeout=120)
        assert reply.status_code == 200, reply.text
        forwarded = httpx.get(peer.url + "/peer/last").json()["body"]
    assert forwarded["max_tokens"] == 50000
