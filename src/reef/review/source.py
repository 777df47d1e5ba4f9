"""The one interface the screens read and decide through, local or remote."""

from __future__ import annotations

from typing import Any, Protocol

from reef.review.rows import (
    Access,
    CandidateDetail,
    CandidateRow,
    RecordRow,
    ReleaseRow,
    ScenarioSummary,
)

LIST_LIMIT = 200  # rows a table holds: the newest, never the whole store


class ReviewSource(Protocol):
    """Reads return dataclasses; decisions raise `DecisionConflict` when the head or the
    candidate moved since the screen was drawn, `ReviewError` for anything else."""

    location: str  # what it reviews, for the title: a folder or a URL

    def access(self) -> Access: ...

    def scenarios(self) -> list[ScenarioSummary]: ...

    def heads(self) -> dict[str, str | None]:
        """Each scenario's head release id, read now."""
        ...

    def candidates(self, state: str | None = None) -> list[CandidateRow]: ...

    def candidate(self, candidate_id: str) -> CandidateDetail: ...

    def releases(self) -> list[ReleaseRow]: ...

    def release_diff(self, release_id: str) -> str: ...

    def records(self, search: str = "") -> list[RecordRow]: ...

    def record(self, record_id: str) -> dict[str, Any]: ...

    def approve(self, candidate_id: str, expected_head: str | None, force: bool = False) -> str:
        """Release a held candidate (one the gate scored worse only with `force`); returns the
        new release id."""
        ...

    def reject(self, candidate_id: str, reason: str) -> None: ...

    def shadow(self, candidate_id: str) -> None:
        """Have a held candidate answer copies of live calls, never heard."""
        ...

    def canary(self, candidate_id: str, share: int, force: bool = False) -> str:
        """Put a held candidate on `share` percent of sessions (one the gate scored worse, or
        never evaluated, only with `force`); returns the canary's release."""
        ...

    def rollback(self, scenario: str, to: str, expected_head: str | None) -> str: ...

    def promote(self, release_id: str, scenario: str, expected_head: str | None) -> str: ...

    def close(self) -> None: ...
