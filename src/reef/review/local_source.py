"""The review source over the project's own stores, whether or not a server runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reef.config import ReefConfig
from reef.errors import Conflict, NotFound, ReefError
from reef.releases.chain import Release, ReleaseConflict
from reef.releases.shadowing import start_shadow
from reef.releases.workflow import ReleaseWorkflow
from reef.review import queries
from reef.review.rows import (
    Access,
    CandidateDetail,
    CandidateRow,
    DecisionConflict,
    RecordRow,
    ReleaseRow,
    ReviewError,
    ScenarioSummary,
)
from reef.review.source import LIST_LIMIT
from reef.store import ExperienceStore


class LocalSource:
    """Reads with `queries`, decides with `ReleaseWorkflow`: the code `reef release` runs."""

    def __init__(self, config: ReefConfig, scenario: str | None = None) -> None:
        self.location = str(Path(config.state_dir).resolve())
        self.scenario = scenario
        self.store = ExperienceStore(config.experience_store, config.store.synchronous)
        self.workflow = ReleaseWorkflow(config, self.store)
        self._releases: tuple[dict[str, str], list[ReleaseRow]] | None = None

    def close(self) -> None:
        self.store.close()

    def access(self) -> Access:
        return Access(can_decide=True)

    def scenarios(self) -> list[ScenarioSummary]:
        found = queries.scenario_summaries(self.workflow)
        return [s for s in found if not self.scenario or s.scenario == self.scenario]

    def heads(self) -> dict[str, str | None]:
        chain = self.workflow.chain
        return {name: _release_id(chain.head(name)) for name in chain.scenarios()}

    def candidates(self, state: str | None = None) -> list[CandidateRow]:
        return queries.candidate_rows(self.workflow, state, self.scenario, LIST_LIMIT)

    def candidate(self, candidate_id: str) -> CandidateDetail:
        return queries.candidate_detail(self.workflow, candidate_id)

    def releases(self) -> list[ReleaseRow]:
        """Read again only when a head moved: the chain is append-only."""
        heads = self.workflow.chain.head_commits()
        if self._releases is None or self._releases[0] != heads:
            rows = queries.release_rows(self.workflow, self.scenario, limit=LIST_LIMIT)
            self._releases = (heads, rows)
        return self._releases[1]

    def release_diff(self, release_id: str) -> str:
        return queries.release_diff(self.workflow, release_id)

    def records(self, search: str = "") -> list[RecordRow]:
        return queries.record_rows(self.store, self.scenario, search, LIST_LIMIT)

    def record(self, record_id: str) -> dict[str, Any]:
        found = self.store.get_record(record_id)
        if found is None:
            raise ReviewError(f"no record {record_id!r}", status=404)
        return found

    def approve(self, candidate_id: str, expected_head: str | None, force: bool = False) -> str:
        with _decision():
            candidate = self.workflow.candidates.get(candidate_id)
            self._check_head(candidate.scenario, expected_head)
            approved = self.workflow.approve(candidate_id, "approved in reef review", force)
        return approved.release_id or ""

    def reject(self, candidate_id: str, reason: str) -> None:
        with _decision():
            self.workflow.reject(candidate_id, reason)

    def shadow(self, candidate_id: str) -> None:
        with _decision():
            start_shadow(self.workflow.candidates, candidate_id)

    def canary(self, candidate_id: str, share: int, force: bool = False) -> str:
        with _decision():
            why = "put on a canary in reef review"
            return self.workflow.canary(candidate_id, share, why, force).release_id or ""

    def rollback(self, scenario: str, to: str, expected_head: str | None) -> str:
        with _decision():
            chain = self.workflow.chain
            return chain.rollback(scenario, to, expected_head=expected_head).release_id

    def promote(self, release_id: str, scenario: str, expected_head: str | None) -> str:
        with _decision():
            chain = self.workflow.chain
            return chain.promote(release_id, scenario, expected_head=expected_head).release_id

    def _check_head(self, scenario: str, expected: str | None) -> None:
        current = _release_id(self.workflow.chain.head(scenario))
        if current != expected:
            raise ReleaseConflict(scenario, expected, current)


def _release_id(release: Release | None) -> str | None:
    return release.release_id if release else None


@contextmanager
def _decision() -> Iterator[None]:
    """Store and chain errors as the review's own: conflicts apart, since they refresh."""
    try:
        yield
    except Conflict as conflict:  # the head moved, or the candidate was decided
        raise DecisionConflict(conflict.message) from None
    except NotFound as error:
        raise DecisionConflict(error.message) from None
    except ReefError as error:
        raise ReviewError(error.message, status=error.status) from None
