"""The serving benchmark's figures: one request's sample, a timed block, a setting's rounds.

A `Measurement` is one setting at one concurrency; it holds a `Block` per round, and each block
the `Sample` of every request sent in it. Throughput is the median of the blocks; latency
percentiles pool every request of every round.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One request's outcome."""

    latency_ms: float
    completion_tokens: int = 0
    text: str | None = None
    has_logprobs: bool = False
    error: str | None = None


@dataclass
class Block:
    """One timed burst of requests for one setting at one concurrency."""

    samples: list[Sample]
    wall_s: float
    other_cores: float  # CPU used meanwhile by processes outside this benchmark
    discarded_ok: int = 0  # requests served in a noisy attempt that was measured again

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    @property
    def tokens_per_s(self) -> float:
        return sum(s.completion_tokens for s in self.ok) / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s


@dataclass
class Measurement:
    """One setting at one concurrency: its blocks from every round."""

    part: str
    setting: str
    concurrency: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [s for block in self.blocks for s in block.samples]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.samples if s.error is not None]

    @property
    def served(self) -> int:
        """Requests the server answered, noisy attempts measured again included."""
        return len(self.ok) + sum(block.discarded_ok for block in self.blocks)

    @property
    def tokens_per_s(self) -> float:
        return median([block.tokens_per_s for block in self.blocks])

    @property
    def requests_per_s(self) -> float:
        return median([block.requests_per_s for block in self.blocks])

    def latency_ms(self, percent: float) -> float:
        return percentile([s.latency_ms for s in self.ok], percent)

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "concurrency": self.concurrency,
            "requests_ok": len(self.ok),
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
            "completion_tokens": sum(s.completion_tokens for s in self.ok),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "requests_per_s": round(self.requests_per_s, 3),
            "p50_ms": round(self.latency_ms(50), 3),
            "p95_ms": round(self.latency_ms(95), 3),
            "rounds": [
                {
                    "requests_ok": len(block.ok),
                    "wall_s": round(block.wall_s, 4),
                    "tokens_per_s": round(block.tokens_per_s, 3),
                    "requests_per_s": round(block.requests_per_s, 3),
                    "other_cores": round(block.other_cores, 3),
                }
                for block in self.blocks
            ],
        }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: list[float], percent: float) -> float:
    """Linear interpolation between the closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percent / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
