"""CPU accounting: the machine may be shared, so say how busy the rest of it was.

From `/proc/stat` (the whole machine) less `/proc/PID/stat` of this process and the benchmark's
own servers: what is left is CPU that other processes used while a block ran.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common.serving.config import console

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOISY_CORES = 0.15  # a block during which others used more than this is measured again
ATTEMPTS = 2
QUIET_SAMPLE_S = 1.0


@dataclass(frozen=True)
class CpuSnapshot:
    machine_s: float  # busy CPU seconds of the whole machine since boot
    ours_s: float  # CPU seconds of this process and the benchmark's servers


def cpu_snapshot(server_pids: tuple[int, ...]) -> CpuSnapshot:
    ours = sum(process_cpu_s(pid) for pid in (os.getpid(), *server_pids))
    return CpuSnapshot(machine_busy_s(), ours)


def other_cores(before: CpuSnapshot, after: CpuSnapshot, wall_s: float) -> float:
    """Cores' worth of CPU used between the snapshots by processes outside the benchmark."""
    others = (after.machine_s - before.machine_s) - (after.ours_s - before.ours_s)
    return max(0.0, others) / wall_s if wall_s > 0 else 0.0


def machine_busy_s() -> float:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    except OSError:  # not Linux: no accounting
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process, all its threads; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def wait_for_quiet(server_pids: tuple[int, ...], limit_s: float) -> None:
    """Wait (at most `limit_s`) until other processes use less than NOISY_CORES."""
    deadline = time.monotonic() + limit_s
    told = False
    while time.monotonic() < deadline:
        before = cpu_snapshot(server_pids)
        time.sleep(QUIET_SAMPLE_S)
        others = other_cores(before, cpu_snapshot(server_pids), QUIET_SAMPLE_S)
        if others <= NOISY_CORES:
            return
        if not told:
            console.print(f"    waiting for other processes to go quiet ({others:.2f} cores) ...")
            told = True
    if told:
        console.print(f"    [yellow]still busy after {limit_s:g} s; measuring anyway[/]")
