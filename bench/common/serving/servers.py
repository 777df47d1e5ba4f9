"""The servers the benchmark compares: the stock llama.cpp server (the baselines), the loopback
OpenAI-compatible peer, and Reef in front of either, each a real process on a free port.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench.common.serving.config import N_CTX, N_THREADS, SEED
from reef.engines.llamacpp import embedded_model_path
from reef.testing.processes import ServerProcess, free_port, reef_serve


@contextmanager
def running(server: ServerProcess, timeout_s: float = 180.0) -> Iterator[ServerProcess]:
    """Start, yield, and stop (SIGINT, then SIGKILL after 30 s) whatever happens in between."""
    try:
        server.start(timeout=timeout_s)
        yield server
    finally:
        server.stop()


def pids_of(*servers: ServerProcess) -> tuple[int, ...]:
    return tuple(server.process.pid for server in servers if server.process is not None)


def stock_llama_server(folder: Path, logits_all: bool, model: Path | None = None) -> ServerProcess:
    """`llama_cpp.server` on `model` (the embedded GGUF when None)."""
    port = free_port()
    args = [
        sys.executable,
        str(Path(__file__).with_name("stock_server.py")),  # llama_cpp.server, Reef's kernels
        "--model",
        str((model or embedded_model_path()).resolve()),
        "--n_ctx",
        str(N_CTX),
        "--n_threads",
        str(N_THREADS),
        "--n_threads_batch",
        str(N_THREADS),
        # The stock default is logits_all=True; baseline A is the server without it.
        "--logits_all",
        str(logits_all).lower(),
        "--seed",
        str(SEED),
        "--verbose",
        "false",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="llama.log")


def write_reef_config(
    folder: Path, engine: dict[str, Any], synchronous: str = "full", log_level: str = "info"
) -> None:
    config = {
        "engine": engine,
        "store": {"synchronous": synchronous},
        "server": {"log_level": log_level},
    }
    (folder / "reef.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def reef_llamacpp_server(folder: Path) -> ServerProcess:
    engine = {"kind": "llamacpp", "llamacpp": {"n_ctx": N_CTX, "n_threads": N_THREADS}}
    write_reef_config(folder, engine)
    return reef_serve(folder, free_port(), "--engine", "llamacpp")


def openai_peer(folder: Path) -> ServerProcess:
    port = free_port()
    args = [sys.executable, "-m", "reef.testing.openai_peer", "--port", str(port)]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="peer.log")


def reef_upstream_server(
    folder: Path, peer_url: str, synchronous: str = "full", log_level: str = "info"
) -> ServerProcess:
    write_reef_config(folder, {"kind": "upstream"}, synchronous, log_level)
    return reef_serve(
        folder, free_port(), "--engine", "upstream", "--upstream-url", f"{peer_url}/v1"
    )


def new_folder(parent: str, name: str) -> Path:
    folder = Path(parent, name)
    folder.mkdir()
    return folder


def stored_records(folder: Path) -> dict[str, int]:
    """Rows per scenario in the experience store of the (stopped) server run in `folder`."""
    with sqlite3.connect(folder / ".reef" / "experience.db") as db:
        rows = db.execute("SELECT scenario, COUNT(*) FROM records GROUP BY scenario").fetchall()
    return {scenario: int(count) for scenario, count in rows}
