"""What the review screens show: plain dataclasses, the same over the stores and over HTTP."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from reef.errors import Conflict, ReefError


class ReviewError(ReefError):
    """An action or a read that failed; the message says why, for the reviewer."""


class DecisionConflict(Conflict):
    """The head or the candidate changed since the screen was drawn: refresh and decide again."""


@dataclass
class Access:
    can_decide: bool
    why: str = ""  # why decisions are disabled, when they are


@dataclass
class ScorePoint:
    created_at: float
    score: float


@dataclass
class ScenarioSummary:
    scenario: str
    head: str | None
    serving: str
    records: int
    reports: int
    recent_mean: float | None
    waiting: int  # candidates held or proposed
    last_step: dict[str, Any] | None
    scores: list[ScorePoint] = field(default_factory=list)
    switches: list[tuple[float, str]] = field(default_factory=list)  # (time, release id)
    # Each release's live pass rates (`reef.evaluation.live.ReleaseProgress.to_json`).
    releases: list[dict[str, Any]] = field(default_factory=list)

    def pass_rate_of(self, release_id: str) -> dict[str, Any] | None:
        """The live pass rate of users' reports on `release_id`'s calls, if it served any."""
        found = next((r for r in self.releases if r["release_id"] == release_id), None)
        return found["reports"] if found else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScenarioSummary:
        scores = [ScorePoint(**point) for point in data.pop("scores", [])]
        switches = [(float(t), str(r)) for t, r in data.pop("switches", [])]
        return cls(**data, scores=scores, switches=switches)


@dataclass
class CandidateRow:
    id: str
    scenario: str
    kind: str
    state: str
    source: str
    reason: str | None
    decision: str | None
    base_release_id: str | None
    release_id: str | None
    created_at: float
    current_mean: float | None
    candidate_mean: float | None
    lost: int = 0  # tasks the candidate scored lower on than the current release
    # On a canary: its latest verdict (`reef.releases.canary.Verdict.to_json`).
    canary: dict[str, Any] | None = None

    @property
    def delta(self) -> float | None:
        if self.current_mean is None or self.candidate_mean is None:
            return None
        return self.candidate_mean - self.current_mean


@dataclass
class TaskView:
    task_id: str
    prompt: str
    current_answer: str
    candidate_answer: str
    current_score: float | None  # None: not scored (a shadow without a scorer)
    candidate_score: float | None


@dataclass
class WeightFile:
    path: str
    size: int
    lfs_oid: str | None


@dataclass
class CandidateDetail:
    row: CandidateRow
    tasks: list[TaskView]
    diff: str
    weights: list[WeightFile]
    loss: list[float]
    record_ids: list[str]
    # In shadow: live calls beside the candidate's answers to their copies, newest first.
    shadows: list[TaskView] = field(default_factory=list)
    # The folder of its learning step's TensorBoard run, on the server's machine, if written.
    run_folder: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CandidateDetail:
        return cls(
            row=CandidateRow(**data["row"]),
            tasks=[TaskView(**task) for task in data["tasks"]],
            diff=data["diff"],
            weights=[WeightFile(**weight) for weight in data["weights"]],
            loss=list(data["loss"]),
            record_ids=list(data["record_ids"]),
            shadows=[TaskView(**task) for task in data.get("shadows", [])],
            run_folder=data.get("run_folder"),
        )


@dataclass
class ReleaseRow:
    release_id: str
    scenario: str
    kind: str
    parent_release_id: str | None
    created_at: float
    reason: str | None
    candidate_id: str | None
    candidate_mean: float | None
    serving: bool
    parts: list[str] = field(default_factory=list)  # harness, adapter: what it carries
    # What it forgot and carried to prompts it never learned from (`reef.evaluation.health`).
    health: str = "-"


@dataclass
class RecordRow:
    id: str
    scenario: str
    release_id: str
    created_at: float
    prompt: str
    answer: str
    feedback: str


def to_json(value: Any) -> Any:
    """A dataclass (or a list of them) as JSON-ready data."""
    if isinstance(value, list):
        return [to_json(item) for item in value]
    return asdict(value)
