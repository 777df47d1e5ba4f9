"""Records as trajectories in OpenAI's chat fine-tuning shape (`{"messages": [...]}` per line).

Calls that share an `x-reef-session` are one conversation: its trajectory is the last call's
messages followed by that call's answer, and it carries the feedback reported on any of its calls.
A call without a session is a trajectory of its own.
"""

from __future__ import annotations

from typing import Any


def trajectories(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One trajectory per session (or per call without one), in the order they began."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        key = f"session:{record['session']}" if record.get("session") else f"record:{record['id']}"
        groups.setdefault(key, []).append(record)
    return [_trajectory(group) for group in groups.values()]


def _trajectory(calls: list[dict[str, Any]]) -> dict[str, Any]:
    last = calls[-1]
    request = last["request"]
    answer = _answer(last["response"])
    line: dict[str, Any] = {"messages": [*request.get("messages", []), answer]}
    if request.get("tools"):
        line["tools"] = request["tools"]
    line["reef"] = {
        "scenario": last["scenario"],
        "session": last.get("session"),
        "record_ids": [call["id"] for call in calls],
        "release_ids": sorted({call["release_id"] for call in calls}),
        "reports": [
            {**report, "record_id": call["id"]}
            for call in calls
            for report in call.get("reports", [])
        ],
    }
    return line


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices") or [{}]
    message = dict(choices[0].get("message") or {"role": "assistant", "content": ""})
    return {key: value for key, value in message.items() if value is not None or key == "content"}
