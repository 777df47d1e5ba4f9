"""How a scenario is served, so that the gate answers its tasks the same way.

A gate that scores one greedy answer judges something users never get: live calls are sampled
(a request that sets no temperature gets the engine's default, 1.0 on llama.cpp). So the gate
samples as the scenario's clients do: at the temperature most of its recent calls asked for,
or, when most set none, with none (the engine's default, exactly as those calls were served);
and with as many tokens as they asked for, up to `gate.max_tokens`. `gate.temperature` set in
reef.yaml overrides what the calls say.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from reef.config import GateConfig
from reef.evaluation.live import IMPORTED
from reef.evaluation.runner import EvalSettings
from reef.store import ExperienceStore

RECENT_CALLS = 50  # the newest calls of a scenario its serving settings are read from


def served_settings(store: ExperienceStore, scenario: str, gate: GateConfig) -> EvalSettings:
    """The sampling the gate answers `scenario`'s tasks with (`gate`, and its recent calls)."""
    requests = [
        record["request"]
        for record in store.latest_records(scenario, limit=RECENT_CALLS)
        if record.get("engine") != IMPORTED and isinstance(record.get("request"), dict)
    ]
    temperature = gate.temperature
    if temperature is None:
        temperature = most_asked_temperature(requests)
    return EvalSettings(
        temperature=temperature,
        seed=gate.seed,
        max_tokens=min(gate.max_tokens, asked_max_tokens(requests) or gate.max_tokens),
        samples=gate.samples,
    )


def most_asked_temperature(requests: list[dict[str, Any]]) -> float | None:
    """The temperature most requests set (None, the engine's default, when most set none)."""
    asked = Counter(_number(request.get("temperature")) for request in requests)
    if not asked:
        return None
    (temperature, _), *_ = asked.most_common(1)
    return temperature


def asked_max_tokens(requests: list[dict[str, Any]]) -> int | None:
    """The median token limit of the requests that set one, or None."""
    asked = (
        request.get("max_completion_tokens") or request.get("max_tokens") for request in requests
    )
    limits = [n for n in asked if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return int(statistics.median_low(limits)) if limits else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
