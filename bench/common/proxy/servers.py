"""The servers `python -m bench.speed.proxy` compares, each a real process on a free loopback port:
the
fake upstream (the stand-in for a remote model), Reef in front of it with its defaults, and the
LiteLLM proxy in front of it. Also what the run reports beside them: the cost of one durable
SQLite commit on the same disk, each server's memory, and the records Reef stored.

LiteLLM runs from its own virtual environment (`bench/out/litellm-venv`, made on first use):
`litellm[proxy]` pins `rich<14` and Reef's `textual` needs `rich>=14.2`, so the two cannot share
one environment (nor one `pip install -e '.[bench]'`).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from bench.common.results import OUT
from bench.common.serving.config import console
from reef.testing.processes import ServerProcess, free_port, reef_serve

HERE = Path(__file__).resolve().parent
LITELLM_VENV = OUT / "litellm-venv"
MODEL = "fake-model"
# What every client sends: one short chat request, tagged with a scenario Reef records it under.
SCENARIO = "bench"
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}]}
).encode()


def fake_upstream(folder: Path) -> ServerProcess:
    port = free_port()
    args = [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port)]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="upstream.log")


def bare_forwarder(folder: Path, upstream_url: str) -> ServerProcess:
    """`bare_forwarder.py`: bytes to the upstream and back, nothing else (the floor under Reef)."""
    port = free_port()
    script = HERE / "bare_forwarder.py"
    args = [sys.executable, str(script), "--port", str(port), "--upstream", upstream_url]
    return ServerProcess(args, port, folder, health_path="/v1/models", log_name="forwarder.log")


def reef_proxy(
    folder: Path, upstream_url: str, token: str, source: Path | None = None
) -> ServerProcess:
    """`reef serve --engine upstream` with Reef's defaults: synchronous full, log level info.
    `source`: a folder holding another version's `src/reef` to run instead of this one."""
    (folder / "reef.yaml").write_text(yaml.safe_dump({"engine": {"kind": "upstream"}}))
    env = {"REEF_TOKEN": token}
    if source is not None:
        env["PYTHONPATH"] = str(source / "src")
    return reef_serve(
        folder, free_port(), "--engine", "upstream", "--upstream-url", f"{upstream_url}/v1",
        env=env,
    )  # fmt: skip


def litellm_proxy(folder: Path, upstream_url: str, key: str, venv: Path) -> ServerProcess:
    """`litellm --config` with one model routed to the fake upstream, a master key, no database,
    the model cost map read from the package (this machine reaches no other host)."""
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"{upstream_url}/v1",
                    "api_key": "sk-fake-upstream",
                },
            }
        ],
        "litellm_settings": {"telemetry": False},
    }
    (folder / "litellm.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    args = [str(venv / "bin" / "litellm"), "--config", "litellm.yaml"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    env = {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return ServerProcess(
        args, port, folder, env=env, health_path="/health/liveliness", log_name="litellm.log"
    )


def ensure_litellm(venv: Path) -> Path:
    """The LiteLLM virtual environment, made and installed with pip on first use."""
    if (venv / "bin" / "litellm").exists():
        return venv
    console.print(f"installing litellm[proxy] into {venv} (once; it cannot share .venv) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"]
    subprocess.run(pip, check=True)
    return venv


def litellm_version(venv: Path) -> str:
    script = "import importlib.metadata as m; print(m.version('litellm'))"
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True
    )
    return found.stdout.strip() or "unknown"


def new_key() -> str:
    return f"sk-bench-{secrets.token_hex(16)}"


def started(server: ServerProcess, timeout_s: float = 300.0) -> float:
    """Start `server`; the seconds until it answered its health check."""
    began = time.perf_counter()
    server.start(timeout=timeout_s)
    return time.perf_counter() - began


def pid_of(server: ServerProcess) -> int:
    assert server.process is not None, "the server was not started"
    return server.process.pid


def rss_mib(pid: int | None) -> float:
    """Resident memory of a process, MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def commit_probe_ms(folder: Path, commits: int = 200) -> float:
    """The median time of one SQLite WAL commit with synchronous=FULL (a ~1 KB row, an fsync) in
    `folder`: what durability costs on this disk now. Each commit runs as Reef's run, on a thread
    woken through a queue (on this machine's virtual disk an fsync from a process's main thread
    took about 4 ms, from such a thread 0.3 ms). The first commits, unmeasured, grow the WAL file
    to the size it is then rewritten at, as in a running store."""
    path = folder / "probe.db"
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA wal_autocheckpoint=50")
        db.execute("CREATE TABLE rows (body TEXT)")
        with ThreadPoolExecutor(max_workers=1) as writer:
            times = [writer.submit(_commit_ms, db).result() for _ in range(100 + commits)][100:]
    finally:
        db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return statistics.median(times)


def _commit_ms(db: sqlite3.Connection) -> float:
    began = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO rows VALUES (?)", ("x" * 1000,))
    db.execute("COMMIT")
    return (time.perf_counter() - began) * 1000


def stored_receipts(folder: Path, scenario: str) -> set[str]:
    """Ids of the records of `scenario` in the store of the (stopped) Reef run in `folder`."""
    with sqlite3.connect(folder / ".reef" / "experience.db") as db:
        rows = db.execute("SELECT id FROM records WHERE scenario = ?", [scenario]).fetchall()
    return {row[0] for row in rows}


def complete_records(folder: Path, scenario: str) -> int:
    """Records of `scenario` with a request, a response and usage."""
    query = (
        "SELECT COUNT(*) FROM records WHERE scenario = ? AND json_valid(request) "
        "AND json_extract(response, '$.choices[0].message.content') IS NOT NULL "
        "AND completion_tokens IS NOT NULL"
    )
    with sqlite3.connect(folder / ".reef" / "experience.db") as db:
        return int(db.execute(query, [scenario]).fetchone()[0])


def environment() -> dict[str, str]:
    return {"python": sys.version.split()[0], "cores": str(os.cpu_count())}
