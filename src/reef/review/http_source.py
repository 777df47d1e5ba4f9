"""The review source over a server's HTTP API (`reef review --url`)."""

from __future__ import annotations

from typing import Any

from reef.client import ReefClient, ReefClientError
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


class HttpSource:
    """Reads the review routes; decides through the same routes as any admin client."""

    def __init__(self, url: str, token: str = "", scenario: str | None = None) -> None:
        self.location = url
        self.scenario = scenario
        self.client = ReefClient(url, token, timeout_s=30)

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The server's answer; a failure as the review's errors (a 404 or 409 means someone
        decided first)."""
        try:
            return self.client.request(method, path, **kwargs)
        except ReefClientError as error:
            if error.status is None:
                raise ReviewError(
                    f"no answer from the Reef server at {self.location} ({error.message}): "
                    "is it running?"
                ) from None
            if error.status in (404, 409):
                raise DecisionConflict(error.message) from None
            raise ReviewError(str(error), status=error.status) from None

    def _params(self, **extra: Any) -> dict[str, Any]:
        params = {"limit": LIST_LIMIT, **{k: v for k, v in extra.items() if v}}
        return {**params, "scenario": self.scenario} if self.scenario else params

    def access(self) -> Access:
        return Access(**self._call("GET", "/reef/review/access"))

    def scenarios(self) -> list[ScenarioSummary]:
        found = [ScenarioSummary.from_json(s) for s in self._call("GET", "/reef/review/overview")]
        return [s for s in found if not self.scenario or s.scenario == self.scenario]

    def heads(self) -> dict[str, str | None]:
        return {s["scenario"]: s["head"] for s in self._call("GET", "/reef/review/overview")}

    def candidates(self, state: str | None = None) -> list[CandidateRow]:
        rows = self._call("GET", "/reef/review/candidates", params=self._params(state=state))
        return [CandidateRow(**row) for row in rows]

    def candidate(self, candidate_id: str) -> CandidateDetail:
        return CandidateDetail.from_json(
            self._call("GET", f"/reef/review/candidates/{candidate_id}")
        )

    def releases(self) -> list[ReleaseRow]:
        rows = self._call("GET", "/reef/review/releases", params=self._params())
        return [ReleaseRow(**row) for row in rows]

    def release_diff(self, release_id: str) -> str:
        return str(self._call("GET", f"/reef/review/releases/{release_id}/diff")["diff"])

    def records(self, search: str = "") -> list[RecordRow]:
        rows = self._call("GET", "/reef/review/records", params=self._params(search=search))
        return [RecordRow(**row) for row in rows]

    def record(self, record_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", f"/reef/records/{record_id}")
        return found

    def approve(self, candidate_id: str, expected_head: str | None, force: bool = False) -> str:
        scenario = self.candidate(candidate_id).row.scenario
        self._check_head(scenario, expected_head)
        body = {"reason": "approved in reef review", "force": force}
        path = f"/reef/scenarios/{scenario}/candidates/{candidate_id}/approve"
        return str(self._call("POST", path, json=body)["release_id"])

    def reject(self, candidate_id: str, reason: str) -> None:
        scenario = self.candidate(candidate_id).row.scenario
        path = f"/reef/scenarios/{scenario}/candidates/{candidate_id}/reject"
        self._call("POST", path, json={"reason": reason})

    def shadow(self, candidate_id: str) -> None:
        scenario = self.candidate(candidate_id).row.scenario
        self._call("POST", f"/reef/scenarios/{scenario}/candidates/{candidate_id}/shadow")

    def canary(self, candidate_id: str, share: int, force: bool = False) -> str:
        scenario = self.candidate(candidate_id).row.scenario
        path = f"/reef/scenarios/{scenario}/candidates/{candidate_id}/canary"
        body = {"share": share, "reason": "put on a canary in reef review", "force": force}
        return str(self._call("POST", path, json=body)["release_id"])

    def rollback(self, scenario: str, to: str, expected_head: str | None) -> str:
        body = {"to": to, "expected_head": expected_head}
        release = self._call("POST", f"/reef/scenarios/{scenario}/rollback", json=body)
        return str(release["release_id"])

    def promote(self, release_id: str, scenario: str, expected_head: str | None) -> str:
        body = {"release_id": release_id, "expected_head": expected_head}
        release = self._call("POST", f"/reef/scenarios/{scenario}/promote", json=body)
        return str(release["release_id"])

    def _check_head(self, scenario: str, expected: str | None) -> None:
        """The approve route compares-and-swaps on the candidate's own parent; this adds the
        head the screen showed, as the local source does (rollback and promote send it to the
        route, which compares it inside the chain's lock)."""
        current = self.heads().get(scenario)
        if current != expected:
            raise DecisionConflict(
                f"the head of scenario {scenario!r} is {current or 'empty (no release yet)'}, "
                f"not {expected or 'empty'}: someone published first"
            )
