"""Shared fixtures: a real `reef serve` on the embedded model, and clients for it."""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from reef.engines.llamacpp import LlamaCppEngine
from reef.testing.postgres import PostgresServer, postgres_available
from reef.testing.processes import ServerProcess, free_port, reef_serve

TOKEN = "test-token-4f1c"
ROTATED_TOKEN = "test-token-next-9a2e"  # a second valid token, as during a rotation
# Tests make an answer run to its max_tokens by banning the end token (`endless()`), and a model
# that cannot end often loops: the engines they use do not end loops (engine.llamacpp.stop_loops),
# or the length would depend on what the model says on the machine. test_generation_limits.py
# tests the loop detector on an engine of its own.
SMALL_ENGINE = "engine:\n  llamacpp:\n    n_ctx: 2048\n    n_threads: 2\n    stop_loops: false\n"
# max_tokens for the longest answer the tests' grammars allow (a forced call to get_weather,
# whose city may be 20 or 40 characters, or a JSON-schema answer): the call's wrapper takes about
# 25 tokens and a sampled string a token per character or more. Smaller caps cut answers, which
# then fail to parse: 60 for a chat call in CI; 40 for a Responses call, 1 run in 40 (60 sampled
# calls took 24 to 52 tokens).
GRAMMAR_ROOM = 160
# The seeds of the tests that sample are offsets from this: `REEF_TEST_SEED=7 pytest` runs them on
# other draws, to show that no test holds only for the draws it was written with.
SEED = int(os.environ.get("REEF_TEST_SEED", "0"))
BODY_LIMIT = 256 * 1024
E2E = Path(__file__).resolve().parent / "e2e"


def pytest_configure(config: pytest.Config) -> None:
    """OpenMP threads that wait passively, in every process of the run: two workers share the
    cores, and llama.cpp's and torch's threads spinning at each barrier for a thread the other
    worker's process has descheduled burn the core it needs. On tests/e2e/engines with two
    workers on two cores: 148 s and 4.5 CPU-minutes spinning, 109 s and 3.2 passive; one worker
    alone took 124 s. Set before either library loads (neither is imported yet); the workers
    and every server a test starts inherit it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is of the end-to-end tier: `pytest -m "not e2e"` leaves it.
    The tier runs first: its tests take seconds to minutes each, and begun while the workers
    are free, the last minutes go to short tests that fill the gaps, not to one worker's long
    test while the other waits."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)  # stable: e2e first


@functools.cache
def embedded_vocabulary() -> Any:
    """The embedded model's tokenizer (no weights loaded)."""
    from llama_cpp import Llama

    from reef.engines.llamacpp import embedded_model_path

    vocabulary = Llama(model_path=str(embedded_model_path()), vocab_only=True, verbose=False)
    atexit.register(vocabulary.close)  # before interpreter teardown, where llama_cpp's is gone
    return vocabulary


def end_of_turn() -> str:
    """The embedded model's end-of-generation token id, as `logit_bias` keys it. A request that
    bans it (`{end_of_turn(): -100}`) runs to exactly its max_tokens, whatever the model would
    have said on this machine, so a test can count on the length."""
    return str(embedded_vocabulary().token_eos())


def token_of(text: str) -> str:
    """The id of the one token of the embedded model that spells `text`, as logit_bias keys it."""
    (token,) = embedded_vocabulary().tokenize(text.encode(), add_bos=False, special=False)
    return str(token)


def endless() -> dict[str, dict[str, int]]:
    """Request fields that ban the end token, for a request that must run to its max_tokens."""
    return {"logit_bias": {end_of_turn(): -100}}


def needs_git_lfs() -> None:
    """Skip where git-lfs is missing (a fresh machine), but fail in CI, which installs it."""
    if shutil.which("git-lfs") is None:
        if os.environ.get("CI"):
            pytest.fail("git-lfs is missing: .ci/run should have installed it")
        pytest.skip("git-lfs is not installed (apt-get install git-lfs); .ci/run installs it")


@pytest.fixture
def node() -> None:
    """Skip where Node is missing (the install scripts run it), but fail in CI, which has it."""
    if shutil.which("node") is None:
        if os.environ.get("CI"):
            pytest.fail("node is missing: the CI machine has Node 20 for the coding agents")
        pytest.skip("node is not installed: the adapters' install scripts run it")


def write_config(folder: Path, text: str = SMALL_ENGINE) -> Path:
    path = folder / "reef.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server on the embedded SmolLM2 model, shared by the tests that only read from it."""
    folder = tmp_path_factory.mktemp("llama-server")
    write_config(folder, SMALL_ENGINE + f"server:\n  max_body_bytes: {BODY_LIMIT}\n")
    server = reef_serve(folder, free_port(), env={"REEF_TOKEN": f"{TOKEN},{ROTATED_TOKEN}"})
    with server.start():
        yield server


@pytest.fixture
def client(llama_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=llama_server.url + "/v1", api_key=TOKEN, max_retries=0)


@pytest.fixture
def http(llama_server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=llama_server.url, headers=headers, timeout=60) as session:
        yield session


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    """The embedded model in process, for tests of the engine and of evaluation."""
    loaded = LlamaCppEngine(n_ctx=1024, n_threads=2, stop_loops=False)
    asyncio.run(loaded.start())
    yield loaded
    asyncio.run(loaded.close())


def peer_process(folder: Path) -> ServerProcess:
    """The loopback OpenAI-compatible peer (`reef.testing.openai_peer`), not started yet."""
    port = free_port()
    args = [sys.executable, "-m", "reef.testing.openai_peer", "--port", str(port)]
    return ServerProcess(args, port, folder, health_path="/v1/models")


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with peer_process(tmp_path_factory.mktemp("peer")).start() as server:
        yield server


def require_postgres() -> None:
    """Skip the test where this machine has no PostgreSQL, but fail it in CI (which installs
    one): a PostgreSQL test skipped there would pass for nothing."""
    reason = postgres_available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests (.ci/run installs it): {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the run; skipped where there is none, but not in CI."""
    require_postgres()
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """The URL of a fresh, empty database on that server, one per test."""
    return postgres.create_database()
