"""How long a CLI command that needs no model takes to start, on this tree and an earlier one.

    .venv/bin/python -m bench.speed.cli_startup [--baseline 964a6d6] [--runs 5]   # ~1 min

Each command runs `--runs` times in a process of its own (`python -m reef …`, importing Reef
from the tree's `src/`), in a fresh project made by `reef init`, against a server that is not
there (`reef status` then says so): the median wall time, beside the same command on the
baseline (a `git worktree`, made and removed here; both trees compiled to bytecode first, as an
installed Reef is) and beside bare Python starting (`python -c pass`), the floor. Issue 75's
target: under 1 s. Written to bench/out/cli_startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common.results import OUT

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "964a6d6"  # main at the end of last round
COMMANDS = [
    ["--version"],
    ["release", "list"],
    ["status", "--url", "http://127.0.0.1:9"],
    ["records", "--help"],
]


def seconds(arguments: list[str], src: Path | None, project: Path, runs: int) -> float:
    """The median wall time of `python [-m reef] ARGUMENTS` importing Reef from `src`."""
    environment = {**os.environ, "PYTHONPATH": str(src)} if src else dict(os.environ)
    command = [sys.executable, *(["-m", "reef"] if src else []), *arguments]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=project, env=environment, capture_output=True, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-startup-") as scratch:
        project, worktree = Path(scratch) / "project", Path(scratch) / "baseline"
        project.mkdir()
        subprocess.run([sys.executable, "-m", "reef", "init"], cwd=project, capture_output=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), options.baseline],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        try:
            for tree in (worktree, ROOT):  # both read from bytecode, as an installed Reef does
                subprocess.run(
                    [sys.executable, "-m", "compileall", "-q", str(tree / "src")],
                    check=True, capture_output=True,
                )  # fmt: skip
            floor = seconds(["-c", "pass"], None, project, options.runs)
            rows = {
                " ".join(arguments): (
                    seconds(arguments, worktree / "src", project, options.runs),
                    seconds(arguments, ROOT / "src", project, options.runs),
                )
                for arguments in COMMANDS
            }
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False
            )
    table = Table(
        title=f"reef CLI start-up, median of {options.runs} (python -c pass: {floor:.2f} s)"
    )
    for header in ("reef …", f"before ({options.baseline})", "this tree", "ratio", "< 1 s"):
        table.add_column(header, justify="right" if header != "reef …" else "left")
    for name, (before, now) in rows.items():
        table.add_row(name, f"{before:.2f} s", f"{now:.2f} s", f"{now / before:.2f}x", str(now < 1))
    Console().print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    found = {
        "floor_s": floor,
        "commands": {k: {"before_s": b, "now_s": n} for k, (b, n) in rows.items()},
    }
    (OUT / "cli_startup.json").write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
