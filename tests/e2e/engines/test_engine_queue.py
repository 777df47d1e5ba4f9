"""Cancellation and back-pressure on the llama.cpp engine, through the real server and model.

A long request here is one the model cannot end early: its end-of-sequence token is banned with
`logit_bias`, so it runs to `max_tokens` (several seconds on two cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from reef.engines.llamacpp import LlamaCppEngine
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, needs_git_lfs, write_config

LONG_TOKENS = 400
SLOTS = 4  # engine.llamacpp.slots, by default


@pytest.fixture(scope="module")
def eos_token() -> int:
    engine = LlamaCppEngine(n_ctx=256, n_threads=1, stop_loops=False)
    asyncio.run(engine.start())
    try:
        return int(engine._model.token_eos())
    finally:
        asyncio.run(engine.close())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("queue")
    write_config(folder, SMALL_ENGINE + "server:\n  max_queue: 2\n")
    with reef_serve(folder, free_port()).start() as running:
        yield running


def long_body(eos: int) -> dict:
    return {
        "messages": [{"role": "user", "content": "Count from one to a thousand in words."}],
        "max_tokens": LONG_TOKENS,
        "logit_bias": {str(eos): -100},
    }


def in_flight(url: str) -> int:
    return int(httpx.get(f"{url}/reef/status").json()["engine"]["in_flight"])


def records(url: str) -> int:
    scenarios = httpx.get(f"{url}/reef/status").json()["store"]["scenarios"]
    return sum(s["records"] for s in scenarios.values())


def wait_until(condition, timeout: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds until `condition()` held; fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - started


def hang_up_after(url: str, body: dict, seconds: float, stream: bool = False) -> None:
    """A client that gives up after `seconds` and closes its connection: a whole response times
    out; a stream is read (it may be running already) until the client has had enough."""
    with httpx.Client(timeout=seconds) as client:
        if not stream:
            with pytest.raises(httpx.TimeoutException):
                client.post(f"{url}/v1/chat/completions", json=body)
            return
        deadline = time.monotonic() + seconds
        with (
            contextlib.suppress(httpx.TimeoutException),
            client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
        ):
            for _ in response.iter_bytes():
                if time.monotonic() > deadline:
                    break


def test_abandoned_requests_free_the_engine(server: ServerProcess, eos_token: int) -> None:
    before = records(server.url)
    hangers = [
        threading.Thread(target=hang_up_after, args=(server.url, long_body(eos_token), 0.7)),
        threading.Thread(target=hang_up_after, args=(server.url, long_body(eos_token), 0.7)),
        threading.Thread(
            target=hang_up_after,
            args=(server.url, {**long_body(eos_token), "stream": True}, 0.7, True),
        ),
    ]
    for thread in hangers:
        thread.start()
    for thread in hangers:
        thread.join()
    # One long request runs about 9 s here, and the three decode together in at least as long
    # (batched, a step of three costs more than a step of one): freed within 6 s means they
    # were stopped (the figure printed is the one in the closing note).
    freed_after = wait_until(lambda: in_flight(server.url) == 0, timeout=6.0)
    print(f"engine free {freed_after:.2f} s after the clients hung up")
    assert records(server.url) == before  # an abandoned call is not a completion
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None


def test_a_full_queue_answers_503_with_retry_after(server: ServerProcess, eos_token: int) -> None:
    statuses: list[httpx.Response] = []

    def call() -> None:
        with httpx.Client(timeout=600) as client:
            body = {**long_body(eos_token), "max_tokens": 30}
            statuses.append(client.post(f"{server.url}/v1/chat/completions", json=body))

    callers = [threading.Thread(target=call) for _ in range(SLOTS + 2 + 3)]
    for thread in callers:
        thread.start()
        time.sleep(0.05)
    for thread in callers:
        thread.join()
    accepted = [r for r in statuses if r.status_code == 200]
    refused = [r for r in statuses if r.status_code == 503]
    # Four running (engine.llamacpp.slots) and two waiting (server.max_queue: 2) are served;
    # the rest are refused.
    assert len(accepted) == SLOTS + 2 and len(refused) == 3, [r.status_code for r in statuses]
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "queue_full" and "server.max_queue" in error["message"]
    assert all("x-reef-agent-record-id" in r.headers for r in accepted)
    assert in_flight(server.url) == 0


def test_a_stream_answers_with_headers_while_it_waits(
    server: ServerProcess, eos_token: int
) -> None:
    busy = threading.Thread(
        target=lambda: httpx.post(
            f"{server.url}/v1/chat/completions",
            json={**long_body(eos_token), "max_tokens": 120},
            timeout=600,
        )
    )
    busy.start()
    wait_until(lambda: in_flight(server.url) == 1, timeout=5)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=600) as r:
        # The headers came while the long request still holds the engine.
        assert r.status_code == 200 and r.headers["x-reef-release-id"] == "base"
        assert in_flight(server.url) == 2
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    busy.join()


def test_logit_bias_must_name_tokens_of_the_model(server: ServerProcess) -> None:
    before = records(server.url)
    for bias in ({"49152": 5}, {"999999999": 1}):
        body = {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": bias}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert "not a token id" in response.json()["error"]["message"]
    assert records(server.url) == before


def test_logit_bias_steers_the_model(server: ServerProcess, eos_token: int) -> None:
    body = {**long_body(eos_token), "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.json()["choices"][0]["finish_reason"] == "length"  # EOS could not come
    assert response.json()["usage"]["completion_tokens"] == 24


def test_server_state_file_is_private(server: ServerProcess) -> None:
    path = Path(server.cwd) / ".reef" / "server.json"
    assert path.stat().st_mode & 0o077 == 0


def test_a_stream_the_engine_fails_after_its_headers_ends_with_an_error_event(
    tmp_path: Path,
) -> None:
    """A LoRA release whose adapter llama.cpp cannot load (approved by hand, past the gate): the
    stream has answered 200 before the engine tries it, so the failure must arrive as an event."""
    needs_git_lfs()
    write_config(tmp_path, SMALL_ENGINE)
    broken = tmp_path / "broken-lora"
    broken.mkdir()
    (broken / "adapter.gguf").write_bytes(b"GGUF but not really an adapter")
    published = run_reef(tmp_path, "release", "publish", str(broken), "--kind", "lora", "--approve")
    assert published.returncode == 0, published.stderr
    with reef_serve(tmp_path, free_port()).start() as running:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
        with httpx.stream(
            "POST", f"{running.url}/v1/chat/completions", json=body, timeout=120
        ) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert "[DONE]" not in events[-1]
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert "LoRA adapter" in error["message"]
        assert records(running.url) == 0  # a failed call is never stored


def test_status_counts_the_prompt_tokens_a_slot_s_cache_saved(server: ServerProcess) -> None:
    def counters() -> dict[str, int]:
        return httpx.get(f"{server.url}/reef/status").json()["engine"]["prompt_cache"]

    rules = " ".join(f"Rule {n}: keep function {n} short." for n in range(1, 31))
    conversation = [{"role": "system", "content": rules}, {"role": "user", "content": "Hi"}]
    before = counters()
    first = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": conversation, "max_tokens": 2, "temperature": 0},
        timeout=120,
    ).json()
    answer = first["choices"][0]["message"]["content"]
    turn = [*conversation, {"role": "assistant", "content": answer}]
    turn.append({"role": "user", "content": "And now?"})
    second = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": turn, "max_tokens": 2, "temperature": 0},
        timeout=120,
    ).json()
    after = counters()
    sent = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert after["prompt_tokens"] - before["prompt_tokens"] == sent
    reused = after["reused_tokens"] - before["reused_tokens"]
    # The second turn resends the first whole: every whole 64-token block of it is reused.
    whole_blocks = first["usage"]["prompt_tokens"] // 64 * 64
    assert whole_blocks >= 64 and whole_blocks <= reused <= first["usage"]["prompt_tokens"], (
        reused,
        first["usage"],
    )
