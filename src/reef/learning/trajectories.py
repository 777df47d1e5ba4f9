"""Records as trajectories in OpenAI's chat fine-tuning shape (`{"messages": [...]}` per line).

Trajectories are merged as the learning loop merges them (`reef.sdk.view`): calls
that share an `x-reef-session`, or whose messages extend an earlier call's, are one conversation.
Its line is the last call's messages followed by that call's answer, and it carries the feedback
reported on any of its calls.
"""

from __future__ import annotations

from typing import Any

from reef.sdk.view import merge_sessions


def trajectories(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per trajectory, in the order they began; `records` oldest first."""
    by_id = {record["id"]: record for record in records}
    lines = []
    for trajectory in merge_sessions(records):
        last = trajectory.turns[-1]
        calls = [by_id[record_id] for record_id in trajectory.record_ids]
        answer = {k: v for k, v in last.answer.items() if v is not None or k == "content"}
        line: dict[str, Any] = {"messages": [*last.messages, answer]}
        if calls[-1]["request"].get("tools"):
            line["tools"] = calls[-1]["request"]["tools"]
        line["reef"] = {
            "scenario": calls[-1]["scenario"],
            "session": calls[-1].get("session"),
            "record_ids": trajectory.record_ids,
            "release_ids": sorted({call["release_id"] for call in calls}),
            "reports": [
                {**report, "record_id": call["id"]}
                for call in calls
                for report in call.get("reports", [])
            ],
        }
        lines.append(line)
    return lines
