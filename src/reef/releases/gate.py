"""The gate's decision: release, reject or hold a candidate, given its paired evaluation."""

from __future__ import annotations

from typing import Literal

from reef.config import GateConfig
from reef.evaluation.runner import PairedReport

Decision = Literal["released", "rejected", "held"]


def decide(gate: GateConfig, report: PairedReport | None) -> tuple[Decision, str]:
    """The decision and a sentence saying why."""
    if gate.policy == "always":
        return "released", "gate policy is always: released without evaluation"
    if report is None:
        return "rejected", "no evaluation ran"
    current, candidate = report.current_mean, report.candidate_mean
    scores = f"candidate {candidate:.3f} vs current {current:.3f} on {len(report.tasks)} task(s)"
    if gate.policy == "review":
        return "held", f"{scores}; gate policy is review: waiting for a human"
    if gate.policy == "floor":
        if candidate >= gate.floor:
            return "released", f"{scores}; meets the floor {gate.floor:.3f}"
        return "rejected", f"{scores}; below the floor {gate.floor:.3f}"
    if candidate > current + gate.margin:
        return "released", f"{scores}; beats current by more than the margin {gate.margin:.3f}"
    return "rejected", f"{scores}; does not beat current by more than the margin {gate.margin:.3f}"
