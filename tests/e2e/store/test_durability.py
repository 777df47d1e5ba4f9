"""Kill -9 in the middle of a burst: every receipt a client received survives, intact, whether
the server runs the model itself or records calls as a proxy in front of an upstream, and
whether experience lives in SQLite or in PostgreSQL."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SMALL_ENGINE, TOKEN, write_config

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _ask(url: str, n: int, client: httpx.Client | None = None) -> tuple[str, str, str] | None:
    """One call; (receipt, prompt, answer) if the whole response arrived, None if cut off."""
    prompt = f"Request {n}: name a fruit."
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12,
        "stream": n % 2 == 1,
    }
    http = client or httpx.Client(timeout=60)
    try:
        if not body["stream"]:
            response = http.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
            return response.headers["x-reef-agent-record-id"], prompt, answer
        text, receipt = "", None
        with http.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=HEADERS
        ) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    text += chunk["choices"][0]["delta"].get("content") or ""
                elif "reef" in chunk:
                    receipt = chunk["reef"]["agent_record_id"]
        return (receipt, prompt, text) if receipt else None
    except (httpx.HTTPError, ValueError):
        return None
    finally:
        if client is None:
            http.close()


def test_kill_9_mid_burst_loses_no_acknowledged_record(tmp_path: Path) -> None:
    write_config(tmp_path, SMALL_ENGINE)
    port = free_port()
    server = reef_serve(tmp_path, port, env={"REEF_TOKEN": TOKEN}).start()
    received: list[tuple[str, str, str]] = []
    enough = threading.Event()
    lock = threading.Lock()

    def ask(n: int) -> None:
        result = _ask(server.url, n)
        if result:
            with lock:
                received.append(result)
                if len(received) >= 6:
                    enough.set()

    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            for n in range(40):
                pool.submit(ask, n)
            assert enough.wait(120), f"no receipts arrived:\n{server.log()}"
            server.kill()
    finally:
        server.kill()
    assert 6 <= len(received) < 40, "the kill should land mid-burst"

    restarted = reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN})
    with restarted.start():
        for receipt, prompt, answer in received:
            response = httpx.get(f"{restarted.url}/reef/records/{receipt}", headers=HEADERS)
            assert response.status_code == 200, f"receipt {receipt} was lost"
            record = response.json()
            assert record["request"]["messages"][0]["content"] == prompt
            assert record["response"]["choices"][0]["message"]["content"] == answer
            assert record["completion_token_ids"]


def test_kill_9_at_concurrency_32_through_the_proxy_loses_no_acknowledged_record(
    tmp_path: Path, peer: ServerProcess
) -> None:
    """32 clients keep calling Reef in front of an upstream (half of them streaming) until 200
    receipts are out, then the server is killed; every receipt is a whole record on restart."""
    _kill_9_while_clients_ask(tmp_path, peer, clients=32, receipts=200)


def test_kill_9_with_one_client_through_the_proxy_loses_no_acknowledged_record(
    tmp_path: Path, peer: ServerProcess
) -> None:
    """One client at a time: each record is committed on the event loop's thread (the writer
    is idle and nobody shares the commit), and is as durable as a group's."""
    _kill_9_while_clients_ask(tmp_path, peer, clients=1, receipts=30)


def test_kill_9_at_concurrency_32_on_postgresql_loses_no_acknowledged_record(
    tmp_path: Path, peer: ServerProcess, postgres_url: str
) -> None:
    """The same with the experience in a real PostgreSQL server (`REEF_STORE_URL`): a receipt
    is handed out only after the server committed its record synchronously."""
    _kill_9_while_clients_ask(tmp_path, peer, clients=32, receipts=200, store_url=postgres_url)


def _kill_9_while_clients_ask(
    tmp_path: Path, peer: ServerProcess, clients: int, receipts: int, store_url: str = ""
) -> None:
    proxy = ("--engine", "upstream", "--upstream-url", f"{peer.url}/v1")
    env = {"REEF_TOKEN": TOKEN, **({"REEF_STORE_URL": store_url} if store_url else {})}
    server = reef_serve(tmp_path, free_port(), *proxy, env=env).start()
    received: list[tuple[str, str, str]] = []
    numbers = itertools.count()
    enough, lock = threading.Event(), threading.Lock()
    deadline = time.monotonic() + 120

    def keep_asking() -> None:
        with httpx.Client(timeout=60) as client:
            while not enough.is_set() and time.monotonic() < deadline:
                result = _ask(server.url, next(numbers), client)
                if result is None:
                    return  # the server is gone
                with lock:
                    received.append(result)
                    if len(received) >= receipts:
                        enough.set()

    try:
        with ThreadPoolExecutor(max_workers=clients) as pool:
            for _ in range(clients):
                pool.submit(keep_asking)
            assert enough.wait(120), f"too few receipts arrived:\n{server.log()}"
            server.kill()
    finally:
        server.kill()

    restarted = reef_serve(tmp_path, free_port(), *proxy, env=env)
    with restarted.start(), httpx.Client(headers=HEADERS) as http:
        for receipt, prompt, answer in received:
            response = http.get(f"{restarted.url}/reef/records/{receipt}")
            assert response.status_code == 200, f"receipt {receipt} was lost"
            record = response.json()
            assert record["request"]["messages"][0]["content"] == prompt
            assert record["response"]["choices"][0]["message"]["content"] == answer
            if not record["stream"]:  # a stream carries usage only when asked for it
                assert record["usage"]["completion_tokens"] > 0
    if store_url:  # the records were in PostgreSQL, not in a file beside the project
        assert not (tmp_path / ".reef/experience.db").exists()


def test_losing_postgresql_while_serving_answers_503_and_hands_out_no_receipt(
    tmp_path: Path, peer: ServerProcess
) -> None:
    """The database goes down under a running server: a call is answered 503 in the API's error
    shape with no receipt (its record could not be stored); once it is back, calls are stored
    again without a restart."""
    from reef.testing.postgres import PostgresServer

    with PostgresServer() as database:
        url = database.create_database()
        proxy = ("--engine", "upstream", "--upstream-url", f"{peer.url}/v1")
        env = {"REEF_TOKEN": TOKEN, "REEF_STORE_URL": url}
        with reef_serve(tmp_path, free_port(), *proxy, env=env).start() as server:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as http:
                assert (
                    "x-reef-agent-record-id" in http.post("/v1/chat/completions", json=body).headers
                )
                database.pause()
                lost = http.post("/v1/chat/completions", json=body)
                assert lost.status_code == 503, lost.text
                assert "x-reef-agent-record-id" not in lost.headers
                error = lost.json()["error"]
                assert (
                    error["code"] == "store_unavailable" and "cannot be reached" in error["message"]
                )
                database.resume()
                back = http.post("/v1/chat/completions", json=body)
                assert back.status_code == 200, back.text
                receipt = back.headers["x-reef-agent-record-id"]
                assert http.get(f"/reef/records/{receipt}").status_code == 200
