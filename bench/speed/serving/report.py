"""The serving benchmark's report: tables, targets met or missed, notes, the machine, the JSON.

Ratios pair each round of a setting with the same round of its baseline, leaving out rounds
during which other processes took the CPUs (unless all were).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.common.serving.config import (
    BASELINE_A,
    ENGINE_CONCURRENCY,
    MAX_ADDED_P50_MS,
    MAX_RECORDING_COST,
    N_CTX,
    N_THREADS,
    PEER_DIRECT,
    REEF_DEFAULTS,
    REEF_NORMAL,
    REEF_OFF,
    REEF_ON,
    REEF_QUIET_LOG,
    ROOT,
    SEED,
    Options,
)
from bench.common.serving.cpu import NOISY_CORES
from bench.common.serving.stats import Measurement, median


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    limit: float
    unit: str

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        verdict = "[green]PASS[/]" if self.passed else "[red]MISS[/]"
        limit = f"target <= {self.limit:g}{self.unit}"
        return f"{verdict} {self.name}: {self.value:.2f}{self.unit} ({limit})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": round(self.value, 3),
            "limit": self.limit,
            "unit": self.unit,
            "passed": self.passed,
        }


def find(measurements: list[Measurement], setting: str, concurrency: int) -> Measurement | None:
    for m in measurements:
        if m.setting == setting and m.concurrency == concurrency:
            return m
    return None


def paired_ratio(m: Measurement, baseline: Measurement, rate: str) -> float:
    """Median over rounds of m's rate / the baseline's rate in the same round.

    Rounds where other processes took the CPUs (flagged noisy) are left out, unless all were.
    """
    pairs = list(zip(m.blocks, baseline.blocks, strict=True))
    clean = [(a, b) for a, b in pairs if max(a.other_cores, b.other_cores) <= NOISY_CORES]
    ratios = [getattr(a, rate) / getattr(b, rate) for a, b in clean or pairs if getattr(b, rate)]
    return median(ratios)


def ratio_cell(m: Measurement, baseline: Measurement | None, rate: str) -> str:
    value = paired_ratio(m, baseline, rate) if baseline else math.nan
    return "-" if math.isnan(value) else f"{value:.2f}x"


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}" if values else "-"


def engine_table(measurements: list[Measurement], options: Options) -> Table:
    table = Table(
        title=f"Engine throughput: SmolLM2-135M Q4_1, greedy, max_tokens {options.max_tokens}, "
        f"n_ctx {N_CTX}, {N_THREADS} threads; tok/s: median of {options.rounds} rounds; "
        f"ratio: median of the rounds' tok/s vs {BASELINE_A!r} in the same round",
        caption="A: stock server, --logits_all false.  B: stock server, --logits_all true, "
        "requests ask logprobs (top_logprobs 1), as does 'Reef, recording on, logprobs'.  "
        f"All requests send seed {SEED} but 'no seed'.",
        title_justify="left",
        caption_justify="left",
    )
    columns = ("setting", "c", "requests", "tok/s", "rounds", "p50 ms", "p95 ms", "ratio")
    for name in columns:
        table.add_column(name, justify="left" if name == "setting" else "right")
    for m in sorted(measurements, key=lambda m: m.concurrency):
        baseline = find(measurements, BASELINE_A, m.concurrency)
        table.add_row(
            m.setting,
            str(m.concurrency),
            requests_cell(m),
            f"{m.tokens_per_s:.1f}",
            spread([block.tokens_per_s for block in m.blocks]),
            ms(m.latency_ms(50)),
            ms(m.latency_ms(95)),
            ratio_cell(m, baseline, "tokens_per_s"),
        )
    return table


def upstream_table(measurements: list[Measurement], options: Options) -> Table:
    table = Table(
        title=f"Upstream overhead: chat requests to the loopback peer; req/s: median of "
        f"{options.rounds} rounds; +p50, +p95 vs {PEER_DIRECT!r}; ratio: median of the rounds' "
        "req/s vs it in the same round",
        caption="Reef's defaults: store.synchronous full (an fsync per commit) and "
        "server.log_level info; 'sync normal' changes only the first, 'log warning' only the "
        "second.",
        title_justify="left",
        caption_justify="left",
    )
    columns = ("setting", "c", "requests", "req/s", "p50 ms", "p95 ms", "+p50", "+p95", "ratio")
    for name in columns:
        table.add_column(name, justify="left" if name == "setting" else "right")
    for m in sorted(measurements, key=lambda m: m.concurrency):
        direct = find(measurements, PEER_DIRECT, m.concurrency)
        added = (
            [m.latency_ms(q) - direct.latency_ms(q) for q in (50, 95)]
            if direct is not None and m.setting != PEER_DIRECT
            else []
        )
        table.add_row(
            m.setting,
            str(m.concurrency),
            requests_cell(m),
            f"{m.requests_per_s:.0f}",
            ms(m.latency_ms(50)),
            ms(m.latency_ms(95)),
            *([ms(value) for value in added] if added else ["", ""]),
            ratio_cell(m, direct, "requests_per_s"),
        )
    return table


def requests_cell(m: Measurement) -> str:
    cell = str(len(m.ok))
    if m.errors:
        cell += f" ({len(m.errors)} failed)"
    return cell


def noise_notes(measurements: list[Measurement]) -> list[str]:
    return [
        f"noisy: {m.setting}, c={m.concurrency}, round {number}: other processes "
        f"used {block.other_cores:.2f} cores meanwhile"
        for m in measurements
        for number, block in enumerate(m.blocks, start=1)
        if block.other_cores > NOISY_CORES
    ]


def engine_targets(measurements: list[Measurement]) -> list[Target]:
    targets = []
    for concurrency in ENGINE_CONCURRENCY:
        on = find(measurements, REEF_ON, concurrency)
        off = find(measurements, REEF_OFF, concurrency)
        if on and off:
            cost = 1 - paired_ratio(on, off, "tokens_per_s")
            name = f"cost of recording (1 - on/off tok/s), c={concurrency}"
            targets.append(Target(name, cost * 100, MAX_RECORDING_COST * 100, "%"))
    return targets


def upstream_targets(measurements: list[Measurement]) -> list[Target]:
    targets = []
    direct = find(measurements, PEER_DIRECT, 1)
    for setting in (REEF_DEFAULTS, REEF_NORMAL, REEF_QUIET_LOG):
        reef = find(measurements, setting, 1)
        if direct and reef:
            added = reef.latency_ms(50) - direct.latency_ms(50)
            targets.append(Target(f"added p50, c=1, {setting}", added, MAX_ADDED_P50_MS, " ms"))
    return targets


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama-cpp-python"),
        "reef": version("reef"),
        "git_commit": git_commit(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
