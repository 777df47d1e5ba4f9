"""What calls a routing policy sent to its arms got: the scores reported on them, the calls a
teacher took over, and the running canary that routed a record (`reef.releases.canary` judges
canaries on them)."""

from __future__ import annotations

from collections.abc import Sequence

from reef.store.experience import ExperienceStore


def arm_reports(
    store: ExperienceStore, routing_release_id: str, arms: Sequence[str]
) -> list[tuple[str, str, float]]:
    """(arm, session, score) of each scored report on calls `routing_release_id` routed to one
    of `arms`, by the first routed record it references (a report without a session is its
    own: `report <id>`)."""
    marks = ",".join("?" * len(arms))
    rows = store.query(
        "SELECT p.id AS report, p.score AS score, r.arm AS arm, r.session AS session "
        "FROM reports p "
        "JOIN report_references rr ON rr.report_id = p.id "
        "JOIN records r ON r.id = rr.record_id "
        f"WHERE r.routing_release_id = ? AND r.arm IN ({marks}) AND p.score IS NOT NULL "
        "ORDER BY p.id, rr.position",
        [routing_release_id, *arms],
    )
    first: dict[str, tuple[str, str, float]] = {}
    for row in rows:
        session = row["session"] or f"report {row['report']}"
        first.setdefault(row["report"], (row["arm"], session, float(row["score"])))
    return list(first.values())


def taken_over(
    store: ExperienceStore, routing_release_id: str, arms: Sequence[str]
) -> list[tuple[str, str]]:
    """(arm, session) of each call the teacher answered because the arm's answer failed."""
    marks = ",".join("?" * len(arms))
    rows = store.query(
        "SELECT id, failed_arm, session FROM records "
        f"WHERE routing_release_id = ? AND failed_arm IN ({marks})",
        [routing_release_id, *arms],
    )
    return [(row["failed_arm"], row["session"] or f"record {row['id']}") for row in rows]


def routing_candidate(
    store: ExperienceStore, record_ids: Sequence[str], state: str
) -> tuple[str, str] | None:
    """(record, candidate): one of these records that a candidate in `state` routed, if any."""
    marks = ",".join("?" * len(record_ids))
    rows = store.query(
        "SELECT r.id AS record, c.id AS candidate FROM records r "
        "JOIN candidates c ON c.release_id = r.routing_release_id "
        f"WHERE c.state = ? AND r.id IN ({marks}) ORDER BY r.id LIMIT 1",
        [state, *record_ids],
    )
    return (rows[0]["record"], rows[0]["candidate"]) if rows else None
