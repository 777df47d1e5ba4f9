"""What `reef review` reads from the experience store, as SQL: recent scores, candidates as rows
of the review's tables, records with their reports. Plain dicts out; reef.review shapes them."""

from __future__ import annotations

from typing import Any

from reef.store.experience import ExperienceStore


def candidate_columns(store: ExperienceStore) -> str:
    """A candidate's columns as the review's tables show them, in the store's SQL."""
    json_number, json_length = store.sql_json_number, store.sql_json_length
    return (
        "id, scenario, kind, state, source, reason, decision, base_release_id, release_id, "
        f"created_at, {json_number('evaluation', 'current_mean')} AS current_mean, "
        f"{json_number('evaluation', 'candidate_mean')} AS candidate_mean, "
        f"COALESCE({json_length('evaluation', 'lost')}, 0) AS lost"
    )


def recent_scores(store: ExperienceStore, scenario: str, limit: int) -> list[dict[str, Any]]:
    """The scenario's last `limit` scores (created_at, score), oldest first."""
    rows = store.query(
        "SELECT created_at, score FROM reports WHERE scenario = ? AND score IS NOT NULL "
        "ORDER BY seq DESC LIMIT ?",
        [scenario, limit],
    )
    return list(reversed(rows))


def recent_mean(store: ExperienceStore, scenario: str, limit: int) -> float | None:
    (row,) = store.query(
        "SELECT AVG(score) AS mean FROM (SELECT score FROM reports "
        "WHERE scenario = ? AND score IS NOT NULL ORDER BY seq DESC LIMIT ?) AS recent",
        [scenario, limit],
    )
    return None if row["mean"] is None else float(row["mean"])


def waiting_candidates(store: ExperienceStore, scenario: str) -> int:
    """Candidates held for a person or still being evaluated."""
    (row,) = store.query(
        "SELECT COUNT(*) AS n FROM candidates WHERE scenario = ? AND state IN ('held', 'proposed')",
        [scenario],
    )
    return int(row["n"])


def candidate_rows(
    store: ExperienceStore, state: str | None, scenario: str | None, limit: int
) -> list[dict[str, Any]]:
    """Held candidates first, then the others; newest first within each."""
    where, params = _where(scenario=scenario, state=state)
    return store.query(
        f"SELECT {candidate_columns(store)} FROM candidates {where} "
        "ORDER BY state = 'held' DESC, seq DESC LIMIT ?",
        [*params, limit],
    )


def candidate_row(store: ExperienceStore, candidate_id: str) -> dict[str, Any]:
    (row,) = store.query(
        f"SELECT {candidate_columns(store)} FROM candidates WHERE id = ?", [candidate_id]
    )
    return row


def _where(**equal: str | None) -> tuple[str, list[Any]]:
    clauses = [f"{name} = ?" for name, value in equal.items() if value]
    params = [value for value in equal.values() if value]
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def newest_records(
    store: ExperienceStore, scenario: str | None, search: str, limit: int
) -> list[dict[str, Any]]:
    """The newest records, newest first; `search` matches their request or response text, or
    one of their tags (`x-reef-tag-<name>: <value>`, found by its value)."""
    clauses, params = [], []
    if scenario:
        clauses.append("scenario = ?")
        params.append(scenario)
    if search:
        like = store.sql_like()  # ignoring case in both databases
        tagged = f"SELECT record_id FROM record_tags WHERE value {like} ? ESCAPE '\\'"
        clauses.append(
            f"(request {like} ? ESCAPE '\\' OR response {like} ? ESCAPE '\\' OR id IN ({tagged}))"
        )
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        params += [pattern, pattern, pattern]
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return store.query(
        "SELECT id, scenario, release_id, created_at, request, response FROM records "
        f"{where} ORDER BY seq DESC LIMIT ?",
        [*params, limit],
    )


def reports_of(store: ExperienceStore, record_ids: list[str]) -> list[dict[str, Any]]:
    """The reports that reference these records (record_id, score, feedback), oldest first."""
    if not record_ids:
        return []
    marks = ",".join("?" * len(record_ids))
    return store.query(
        "SELECT rr.record_id, r.score, r.feedback FROM report_references rr "
        f"JOIN reports r ON r.id = rr.report_id WHERE rr.record_id IN ({marks}) ORDER BY r.seq",
        record_ids,
    )
