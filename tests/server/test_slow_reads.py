"""A slow store read never delays other requests or streams: while one route waits for the
store's read lock (a review search holds it), `/healthz` and a streamed chat completion answer.

Reef runs in this process, served by uvicorn on loopback from a thread, over the loopback peer as
its upstream engine, so that the test can hold the very lock the store's reads take. The routes
used to read on the event loop, which stalled every request until the read ended.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from reef.config import load_config
from reef.engines import build_engine
from reef.releases.workflow import ReleaseWorkflow
from reef.server.state import ServerState
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess
from tests.conftest import write_config
from tests.support.in_process import serving

BOUND_S = 10  # far longer than any answer here; a stalled loop answers only once reads resume
HI = [{"role": "user", "content": "Say hi."}]


class HeldReadLock:
    """Stands in for the store's read lock, held by the test as a long search would hold it;
    `waited` is set once a read is waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.waited = threading.Event()

    def __enter__(self) -> None:
        self.waited.set()
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def release(self) -> None:
        """End the test's hold: the waiting read goes on, and later reads take the lock."""
        self._lock.release()


@dataclass
class Reef:
    url: str
    store: ExperienceStore
    receipt: str  # a record stored before any read is held


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory, peer: ServerProcess) -> Iterator[Reef]:
    folder = tmp_path_factory.mktemp("slow-reads")
    engine_config = f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n"
    config = load_config(write_config(folder, engine_config), env={})
    store = ExperienceStore(config.experience_db)
    engine = build_engine(config.engine)
    state = ServerState(config, engine, store, ReleaseWorkflow(config, store))
    try:
        with serving(state) as url:
            answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": HI}, timeout=30)
            assert answer.status_code == 200, answer.text
            yield Reef(url, store, answer.headers["x-reef-agent-record-id"])
    finally:
        store.close()


def _streamed_text(url: str) -> str:
    body = {"messages": HI, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=BOUND_S) as answer:
        assert answer.status_code == 200
        events = [line.removeprefix("data: ") for line in answer.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


# Each route's reads wait for the read lock; the status each answers once it is free.
READS = [
    ("GET", "/reef/records", None, 200),
    ("GET", "/reef/records?order=desc", None, 200),
    ("GET", "/reef/records?after=rec_missing", None, 404),
    ("GET", "/reef/records/{receipt}", None, 200),
    ("GET", "/reef/status", None, 200),
    ("POST", "/reef/scenarios/default/candidates/cand_missing/reject", {"reason": "no"}, 404),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), READS)
def test_other_requests_answer_while_a_read_waits_for_the_store(
    reef: Reef,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
) -> None:
    held = HeldReadLock()
    monkeypatch.setattr(reef.store, "_read_lock", held)
    url = reef.url + path.format(receipt=reef.receipt)
    with ThreadPoolExecutor(1) as pool:
        slow: Future[httpx.Response] = pool.submit(
            httpx.request, method, url, json=body, timeout=3 * BOUND_S
        )
        try:
            assert held.waited.wait(BOUND_S), f"{method} {path} never read the store"
            health = httpx.get(f"{reef.url}/healthz", timeout=BOUND_S)
            streamed = _streamed_text(reef.url)
            assert not slow.done(), "the read ended before the test let it"
        finally:
            held.release()
        answer = slow.result(BOUND_S)
    assert health.status_code == 200
    assert streamed.strip() == "echo: Say hi."
    assert answer.status_code == status, answer.text
