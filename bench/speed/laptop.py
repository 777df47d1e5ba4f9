"""Reef on a laptop: a busy CPU, a lone request's speed, and memory, beside the stock server.

    .venv/bin/python -m bench.speed.laptop [--rounds 3] [--requests 4] [--tokens 128]

Three servers on the embedded SmolLM2-135M, 2 threads each, started in turn:

- **Reef** as `reef serve` runs it by default (thread counts timed per call, q8_0 keys in the KV
  cache);
- **Reef, before**: the same with `adaptive_threads: false` and `cache_type_k: f16`, the engine
  as it was before this benchmark's changes (the baseline for "no more than 5% slower when
  quiet");
- **llama_cpp.server**, the stock server of the same llama.cpp, with Reef's weight kernels
  (bench/common/serving/stock_server.py), `--n_ctx 2048`, one sequence.

Each round measures every server quiet, then under one competing busy process (a Python loop
spinning on one core): completion tokens/s of `--requests` sequential requests of `--tokens`
tokens each (greedy, the end token banned and Reef's loop stop off, so every server does the
same work). Rounds interleave the servers, so a slow spell of the machine hits each alike; the
medians are printed with each server's busy share (busy / quiet), Reef's quiet speed against
the stock server's and against before, and each server's resident memory at idle (after one
request) with the KV capacity it holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.common.results import OUT
from bench.common.serving.servers import running, stock_llama_server, write_reef_config
from reef.testing.processes import ServerProcess, free_port, reef_serve

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
EOS = "2"  # SmolLM2's <|im_end|>, banned so that every answer runs to its max_tokens
REEF = "Reef"
BEFORE = "Reef, before"
STOCK = "llama_cpp.server"


def reef_server(folder: Path, before: bool) -> ServerProcess:
    engine = {"n_ctx": 8192, "n_threads": 2, "stop_loops": False}
    if before:
        engine |= {"adaptive_threads": False, "cache_type_k": "f16"}
    write_reef_config(folder, {"kind": "llamacpp", "llamacpp": engine})
    return reef_serve(folder, free_port())


def server_for(name: str, folder: Path) -> ServerProcess:
    if name == STOCK:
        return stock_llama_server(folder, logits_all=False)
    return reef_server(folder, before=name == BEFORE)


def tokens_per_second(url: str, requests: int, tokens: int) -> float:
    body = {"messages": PROMPT, "max_tokens": tokens, "temperature": 0, "logit_bias": {EOS: -100}}
    headers = {"x-reef-capture": "false"}
    generated, started = 0, time.perf_counter()
    for _ in range(requests):
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=900)
        reply.raise_for_status()
        generated += reply.json()["usage"]["completion_tokens"]
    return generated / (time.perf_counter() - started)


@contextmanager
def busy_core() -> Iterator[None]:
    """One other process spinning on a core, as a build or a browser tab would."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def resident_mb(server: ServerProcess) -> float:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    (line,) = [row for row in status.splitlines() if row.startswith("VmRSS:")]
    return int(line.split()[1]) / 1024


def capacity(server: ServerProcess, name: str) -> str:
    if name == STOCK:
        return "1 x 2048 tokens, f16"
    cache = httpx.get(f"{server.url}/reef/status").json()["engine"]["kv_cache"]
    kinds = f"K {cache['type_k']}, V {cache['type_v']}"
    return f"{cache['slots']} x {cache['tokens_per_slot']} tokens, {kinds}"


def measure(args: argparse.Namespace) -> dict:
    names = [REEF, BEFORE, STOCK]
    quiet: dict[str, list[float]] = {n: [] for n in names}
    busy: dict[str, list[float]] = {n: [] for n in names}
    memory: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="reef-laptop-") as scratch:
        for number in range(args.rounds):
            for name in names:
                folder = Path(scratch, f"{name.replace(' ', '_')}-{number}")
                folder.mkdir()
                with running(server_for(name, folder)) as server:
                    tokens_per_second(server.url, 1, 8)  # warm
                    if name not in memory:
                        memory[name] = {
                            "resident_mb": round(resident_mb(server)),
                            "capacity": capacity(server, name),
                        }
                    quiet[name].append(tokens_per_second(server.url, args.requests, args.tokens))
                    with busy_core():
                        busy[name].append(tokens_per_second(server.url, args.requests, args.tokens))
                print(
                    f"round {number + 1} {name:17} quiet {quiet[name][-1]:6.1f} "
                    f"busy {busy[name][-1]:6.1f} tokens/s",
                    flush=True,
                )
    return {"quiet": quiet, "busy": busy, "memory": memory}


def report(raw: dict) -> dict:
    quiet = {n: statistics.median(v) for n, v in raw["quiet"].items()}
    busy = {n: statistics.median(v) for n, v in raw["busy"].items()}
    share = {n: busy[n] / quiet[n] for n in quiet}
    print("\nmedians (completion tokens/s, c=1):")
    for name in quiet:
        memory = raw["memory"][name]
        print(
            f"  {name:17} quiet {quiet[name]:6.1f}  busy {busy[name]:6.1f}  busy share "
            f"{share[name]:.2f}  resident {memory['resident_mb']:5d} MB  "
            f"({memory['capacity']})"
        )
    summary = {
        "reef_busy_share": share[REEF],
        "stock_busy_share": share[STOCK],
        "before_busy_share": share[BEFORE],
        "reef_quiet_over_before": quiet[REEF] / quiet[BEFORE],
        "reef_quiet_over_stock": quiet[REEF] / quiet[STOCK],
        "reef_busy_over_stock_busy": busy[REEF] / busy[STOCK],
    }
    print(
        f"\n  busy share: Reef {share[REEF]:.2f} vs stock {share[STOCK]:.2f} (target: at least "
        f"the stock server's); before {share[BEFORE]:.2f}\n"
        f"  quiet: Reef / before {summary['reef_quiet_over_before']:.2f}x (target >= 0.95), "
        f"Reef / stock {summary['reef_quiet_over_stock']:.2f}x (target >= 1.0)"
    )
    return {"medians": {"quiet": quiet, "busy": busy}, **summary, **raw}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="sequential requests a figure")
    parser.add_argument("--tokens", type=int, default=128, help="completion tokens a request")
    parser.add_argument("--json", type=Path, default=OUT / "laptop.json")
    args = parser.parse_args()
    result = report(measure(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
