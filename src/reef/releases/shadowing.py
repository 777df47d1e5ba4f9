"""A shadow: a held or proposed candidate answering copies of its scenario's live calls, never
heard, so that a human can read its answers beside the live ones before deciding.

Starting one only moves the candidate to `shadow`; the server's shadow runner
(`reef.daemon.shadow`) finds it there and answers the copies on idle capacity. A
human's decision ends it: the workflow approves or rejects a candidate in shadow as it does a
held one (`SHADOW` is among the states each accepts).
"""

from __future__ import annotations

from reef.store.candidates import Candidate, CandidateStore

SHADOW = "shadow"


def start_shadow(candidates: CandidateStore, candidate_id: str) -> Candidate:
    """Have a held or proposed candidate answer copies of its scenario's live calls, never
    heard; approve or reject ends it."""
    return candidates.move(
        candidate_id, ("held", "proposed"), SHADOW, decision="answering copies of live calls"
    )
