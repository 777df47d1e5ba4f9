"""One model per machine: memory and model mappings of `reef serve` with and without learning.

    python -m bench.speed.one_engine

Starts the server on the embedded model twice, in fresh folders: once without a recipe (the
baseline), once with `learning.recipe: harness_evolve`, whose worker process evaluates on the
server's engine over loopback. For each it waits until the server has answered a few requests
(and the worker has run a learning step), then prints, for the whole process tree, the memory
(PSS, so pages shared between processes count once) and which processes map the model file.
Goal: one process maps the model, and the tree with learning stays within 1.2x of the baseline.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from reef.testing.processes import ServerProcess, free_port, reef_serve

ENGINE = ""  # the default engine settings, as `reef serve` runs
LEARNING = """learning:
  recipe: harness_evolve
  interval_s: 0.5
  proposer: rule
  batch_size: 1
  scorer: {type: regex, pattern: "Cheers\\\\s*$"}
"""
TASK = {
    "messages": [{"role": "user", "content": "Name a colour."}],
    "scorer": {"type": "regex", "pattern": "Cheers\\s*$"},
}


def tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = [int(c) for c in children.read_text().split()] if children.exists() else []
    return [pid, *(p for child in found for p in tree(child))]


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def maps_model(pid: int) -> bool:
    return any(
        line.endswith(".gguf") for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
    )


def exercise(server: ServerProcess, learning: bool) -> None:
    body = {"messages": [{"role": "user", "content": "Name an animal."}], "max_tokens": 32}
    for _ in range(3):
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        if learning:
            report = {
                "references": [reply.headers["x-reef-agent-record-id"]],
                "score": 0,
                "feedback": "End every answer with the line: Cheers",
            }
            httpx.post(f"{server.url}/reef/report", json=report, timeout=30)
    if learning:  # wait for a learning step that evaluated on the server
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = httpx.get(f"{server.url}/reef/status").json()
            if status["learning"]["scenarios"].get("default", {}).get("last_step"):
                return
            time.sleep(1)


def measure(learning: bool) -> tuple[list[float], int]:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "reef.yaml").write_text(ENGINE + (LEARNING if learning else ""))
        (folder / "evals").mkdir()
        (folder / "evals/default.jsonl").write_text(json.dumps(TASK) + "\n")
        with reef_serve(folder, free_port()).start() as server:
            assert server.process is not None
            exercise(server, learning)
            pids = tree(server.process.pid)
            return [pss_mib(pid) for pid in pids], sum(maps_model(pid) for pid in pids)


def main() -> None:
    rows = {
        "reef serve (baseline)": measure(learning=False),
        "reef serve + learning worker": measure(learning=True),
    }
    print(f"{'':32}{'processes':>10}{'map the model':>15}{'PSS MiB (each)':>24}{'total':>8}")
    for name, (memory, mapping) in rows.items():
        each = " + ".join(f"{m:.0f}" for m in memory)
        print(f"{name:32}{len(memory):>10}{mapping:>15}{each:>24}{sum(memory):>8.1f}")
    (baseline, _), (learning, mapping) = rows.values()
    ratio = sum(learning) / sum(baseline)
    print(f"memory ratio, learning / baseline: {ratio:.2f} (goal <= 1.20)")
    sys.exit(0 if mapping == 1 and ratio <= 1.2 else 1)


if __name__ == "__main__":
    main()
