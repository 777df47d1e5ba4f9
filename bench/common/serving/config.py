"""What the serving benchmark measures: the requests, the settings' names, the targets, options.

Every module of the benchmark reads its constants from here, so the figures a run prints can be
traced back to one place. `Options` is what the command line chose
(`bench/speed/serving/__main__.py`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench.common.results import OUT

ROOT = Path(__file__).resolve().parents[3]  # the repository
DEFAULT_OUT = OUT / "serving.json"

# The engine part: one prompt that makes the model write at length, greedy, same for everyone.
PROMPT = "Write a long story about a lighthouse keeper."
SEED = 42
N_CTX = 2048
N_THREADS = 2
ENGINE_CONCURRENCY = (1, 4)
ENGINE_TIMEOUT_S = 300.0

# The upstream part: a short chat the peer echoes back.
UPSTREAM_CONCURRENCY = (1, 32)
UPSTREAM_TIMEOUT_S = 30.0

# The targets Reef is held to.
MAX_RECORDING_COST = 0.03  # recording may cost at most 3% of engine throughput
MAX_ADDED_P50_MS = 2.0  # the upstream proxy may add at most 2 ms at p50, concurrency 1

# The settings, as the tables name them.
BASELINE_A = "A: llama_cpp.server"
BASELINE_B = "B: llama_cpp.server, logprobs"
REEF_OFF = "Reef, recording off"
REEF_ON = "Reef, recording on"
REEF_ON_LOGPROBS = "Reef, recording on, logprobs"
REEF_ON_NO_SEED = "Reef, recording on, no seed"
PEER_DIRECT = "peer, direct"
REEF_DEFAULTS = "Reef -> peer, defaults"
REEF_NORMAL = "Reef -> peer, sync normal"
REEF_QUIET_LOG = "Reef -> peer, log warning"

console = Console(width=None if sys.stdout.isatty() else 100)


@dataclass(frozen=True)
class Options:
    part: str
    rounds: int
    engine_requests: tuple[int, int]
    upstream_requests: tuple[int, int]
    engine_warmup: int
    upstream_warmup: int
    max_tokens: int
    time_limit_s: float
    quiet_wait_s: float
    out: Path
