"""The reads behind the review screens, on the stores: paged (the SQL is store/review.py).

Both the local source and the server's review routes call these, so the screens see the same
data either way. No Textual here: the server imports this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from reef.errors import ReefError
from reef.evaluation.health import Health, chain_health
from reef.evaluation.live import ReleaseProgress, against_gate, live_progress, recipe_scorer
from reef.evaluation.tasks import load_tasks, tasks_path
from reef.learning.trackers import run_folder
from reef.protocol import last_user_text, response_text
from reef.releases.canary import arm_scores, judge
from reef.releases.chain import Release, is_weight_file, lfs_size, read_folder, text_diff
from reef.releases.workflow import ReleaseWorkflow
from reef.review.rows import (
    CandidateDetail,
    CandidateRow,
    RecordRow,
    ReleaseRow,
    ScenarioSummary,
    ScorePoint,
    TaskView,
    WeightFile,
)
from reef.store import ExperienceStore
from reef.store import review as review_sql
from reef.store.learning import learning_status
from reef.store.shadows import shadows_of

CURVE_POINTS = 120  # scored reports in a scenario's curve
RECENT_SCORES = 50  # reports in "mean feedback score of recent traffic"
SHADOWS_SHOWN = 30  # a shadow candidate's latest answers beside the live ones


def _store(workflow: ReleaseWorkflow) -> ExperienceStore:
    return workflow.candidates.store


# -- scenarios ------------------------------------------------------------------------------


def scenario_summaries(
    workflow: ReleaseWorkflow, serving: dict[str, str] | None = None
) -> list[ScenarioSummary]:
    """Each scenario with records or releases. `serving` maps a scenario to the release a
    server serves; without one, the head is what a server would switch to."""
    store = _store(workflow)
    counts = store.stats()["scenarios"]
    heads = {name: workflow.chain.head(name) for name in workflow.chain.scenarios()}
    steps = learning_status(store)
    summaries = []
    for name in sorted(set(counts) | set(heads)):
        head = heads.get(name)
        head_id = head.release_id if head else None
        scores = score_points(store, name)
        summaries.append(
            ScenarioSummary(
                scenario=name,
                head=head_id,
                serving=(serving or {}).get(name, head_id or "base"),
                records=counts.get(name, {}).get("records", 0),
                reports=counts.get(name, {}).get("reports", 0),
                recent_mean=review_sql.recent_mean(store, name, RECENT_SCORES),
                waiting=review_sql.waiting_candidates(store, name),
                last_step=steps.get(name, {}).get("last_step"),
                scores=scores,
                switches=_switches(workflow, head, scores),
                releases=[
                    r.to_json() | against_gate(workflow.chain.evaluation_of(r.release_id), r)
                    for r in _progress(workflow, name)
                ],
            )
        )
    return summaries


def _progress(workflow: ReleaseWorkflow, scenario: str) -> list[ReleaseProgress]:
    config = workflow.config
    threshold = config.gate_for(scenario).replay_threshold
    return live_progress(_store(workflow), scenario, threshold, recipe_scorer(config, scenario))


def score_points(store: ExperienceStore, scenario: str) -> list[ScorePoint]:
    rows = review_sql.recent_scores(store, scenario, CURVE_POINTS)
    return [ScorePoint(row["created_at"], row["score"]) for row in rows]


def _switches(
    workflow: ReleaseWorkflow, head: Release | None, scores: list[ScorePoint]
) -> list[tuple[float, str]]:
    """The releases published since the curve's first point, oldest first."""
    if head is None or not scores:
        return []
    since = scores[0].created_at
    found = [
        (release.created_at, release.release_id)
        for release in walk_releases(workflow, head, limit=50)
        if release.created_at >= since
    ]
    return sorted(found)


# -- candidates -----------------------------------------------------------------------------


def candidate_rows(
    workflow: ReleaseWorkflow,
    state: str | None = None,
    scenario: str | None = None,
    limit: int = 200,
) -> list[CandidateRow]:
    """Held candidates first, then the others; newest first within each."""
    rows = review_sql.candidate_rows(_store(workflow), state, scenario, limit)
    return [CandidateRow(**row, canary=_canary(workflow, row)) for row in rows]


def _canary(workflow: ReleaseWorkflow, row: dict[str, Any]) -> dict[str, Any] | None:
    """A candidate on a canary: how its reports stand now, and what happens next."""
    if row["state"] != "canary" or not row["release_id"]:
        return None
    settings = workflow.config.gate_for(row["scenario"]).canary
    scores = arm_scores(_store(workflow), row["release_id"], settings.score_range)
    started = workflow.candidates.get(row["id"]).updated_at
    return judge(settings, scores, time.time() - started).to_json()


def candidate_detail(workflow: ReleaseWorkflow, candidate_id: str) -> CandidateDetail:
    candidate = workflow.candidates.get(candidate_id)
    row = review_sql.candidate_row(_store(workflow), candidate_id)
    evaluation = candidate.evaluation or {}
    prompts = _task_prompts(workflow, candidate.scenario)
    results = evaluation.get("results", [])
    # Regressions first: the tasks the candidate scores lower on, then the others in order.
    results = sorted(results, key=lambda r: r["candidate_score"] >= r["current_score"])
    tasks = [
        TaskView(
            task_id=result["task_id"],
            prompt=result.get("prompt")
            or prompts.get(result["task_id"], "(task no longer in the eval file)"),
            current_answer=result["current_answer"],
            candidate_answer=result["candidate_answer"],
            current_score=result["current_score"],
            candidate_score=result["candidate_score"],
        )
        for result in results
    ]
    files = _candidate_files(workflow, candidate.files_path, candidate.release_id)
    loss = (candidate.metrics or {}).get("loss") or []
    return CandidateDetail(
        row=CandidateRow(**row, canary=_canary(workflow, row)),
        tasks=tasks,
        diff=_candidate_diff(workflow, candidate.base_release_id, candidate.id, files),
        weights=_weights(files),
        loss=[float(value) for value in loss if isinstance(value, int | float)],
        record_ids=list(candidate.consumed_record_ids),
        shadows=_shadow_pairs(workflow, candidate.id),
        run_folder=_run_folder(workflow, candidate.scenario, candidate.id),
    )


def _run_folder(workflow: ReleaseWorkflow, scenario: str, candidate_id: str) -> str | None:
    """Where the learning step that proposed the candidate wrote its TensorBoard run."""
    folder = run_folder(workflow.config.state_dir, scenario, candidate_id)
    return str(folder) if folder.is_dir() else None


def _shadow_pairs(workflow: ReleaseWorkflow, candidate_id: str) -> list[TaskView]:
    """A candidate's shadow answers beside the live answers they copied, newest first."""
    return [
        TaskView(
            task_id=row["live_record_id"],
            prompt=last_user_text(row["live_request"].get("messages") or []),
            current_answer=response_text(row["live_response"]),
            candidate_answer=response_text(row["response"]),
            current_score=row["live_score"],
            candidate_score=row["shadow_score"],
        )
        for row in shadows_of(_store(workflow), candidate_id, SHADOWS_SHOWN)
    ]


def _task_prompts(workflow: ReleaseWorkflow, scenario: str) -> dict[str, str]:
    try:
        tasks = load_tasks(tasks_path(workflow.config.evals_dir, scenario))
    except ReefError:
        return {}
    return {task.id: last_user_text(task.messages) for task in tasks}


def _candidate_files(
    workflow: ReleaseWorkflow, folder: str, release_id: str | None
) -> dict[str, bytes] | None:
    """The candidate's files, weights as LFS pointers where they come from the chain; None when
    its folder was pruned and it was never released."""
    with contextlib.suppress(ReefError, OSError):
        return read_folder(Path(folder))
    if release_id:
        return workflow.chain.stored_files(release_id)
    return None


def _candidate_diff(
    workflow: ReleaseWorkflow, base: str | None, name: str, files: dict[str, bytes] | None
) -> str:
    if files is None:
        return "(its files were pruned: only the newest decided candidates keep theirs)"
    old = workflow.chain.stored_files(base) if base else {}
    return text_diff(old, files, base or "empty", name) or "(same files as its parent)"


def _weights(files: dict[str, bytes] | None) -> list[WeightFile]:
    weights = []
    for path, data in sorted((files or {}).items()):
        if not is_weight_file(path):
            continue
        pointer = data.startswith(b"version https://git-lfs")
        oid = _pointer_oid(data) if pointer else hashlib.sha256(data).hexdigest()
        weights.append(WeightFile(path, lfs_size(data) if pointer else len(data), oid))
    return weights


def _pointer_oid(pointer: bytes) -> str | None:
    for line in pointer.decode(errors="replace").splitlines():
        if line.startswith("oid sha256:"):
            return line.removeprefix("oid sha256:")
    return None


# -- releases -------------------------------------------------------------------------------


def walk_releases(workflow: ReleaseWorkflow, head: Release, limit: int) -> list[Release]:
    """From `head` back along its parents, at most `limit`, newest first."""
    releases = [head]
    while len(releases) < limit and releases[-1].parent_release_id:
        releases.append(workflow.chain.get(releases[-1].parent_release_id))
    return releases


def release_rows(
    workflow: ReleaseWorkflow,
    scenario: str | None = None,
    serving: dict[str, str] | None = None,
    limit: int = 200,
) -> list[ReleaseRow]:
    """The chains of one scenario or all, newest first."""
    names = [scenario] if scenario else workflow.chain.scenarios()
    rows = []
    for name in names:
        head = workflow.chain.head(name)
        if head is None:
            continue
        serves = (serving or {}).get(name, head.release_id)
        chain = walk_releases(workflow, head, limit)
        health = chain_health([(r.release_id, r.evaluation) for r in reversed(chain)])
        rows += [
            _release_row(release, release.release_id == serves, health[release.release_id])
            for release in chain
        ]
    return sorted(rows, key=lambda row: row.created_at, reverse=True)[:limit]


def _release_row(release: Release, serving: bool, health: Health) -> ReleaseRow:
    return ReleaseRow(
        release_id=release.release_id,
        scenario=release.scenario,
        kind=release.kind,
        parent_release_id=release.parent_release_id,
        created_at=release.created_at,
        reason=release.reason,
        candidate_id=release.candidate_id,
        candidate_mean=(release.evaluation or {}).get("candidate_mean"),
        serving=serving,
        parts=release.carried_parts,
        health=health.said(),
    )


def release_diff(workflow: ReleaseWorkflow, release_id: str) -> str:
    """The diff against its parent, as recorded when it was published, with weight sizes."""
    release = workflow.chain.get(release_id)
    weights = [
        f"weights {path}: {lfs_size(data)} bytes\n"
        for path, data in sorted(workflow.chain.stored_files(release_id).items())
        if is_weight_file(path)
    ]
    parent = release.parent_release_id or "empty"
    header = f"{release_id} against {parent}: {release.reason or ''}\n"
    return header + (release.diff or "(same files as its parent)\n") + "".join(weights)


# -- records --------------------------------------------------------------------------------


def record_rows(
    store: ExperienceStore, scenario: str | None = None, search: str = "", limit: int = 200
) -> list[RecordRow]:
    """The newest records, newest first; `search` matches their request or response text, or a
    tag's value."""
    rows = review_sql.newest_records(store, scenario, search, limit)
    feedback = _feedback(store, [row["id"] for row in rows])
    return [
        RecordRow(
            id=row["id"],
            scenario=row["scenario"],
            release_id=row["release_id"],
            created_at=row["created_at"],
            prompt=last_user_text(json.loads(row["request"]).get("messages", [])),
            answer=response_text(json.loads(row["response"])),
            feedback=feedback.get(row["id"], ""),
        )
        for row in rows
    ]


def _feedback(store: ExperienceStore, record_ids: list[str]) -> dict[str, str]:
    rows = review_sql.reports_of(store, record_ids)
    found: dict[str, list[str]] = {}
    for row in rows:
        report = {**row, "feedback": json.loads(row["feedback"]) if row["feedback"] else None}
        found.setdefault(row["record_id"], []).append(describe_report(report))
    return {record_id: "; ".join(parts) for record_id, parts in found.items()}


def describe_report(report: dict[str, Any]) -> str:
    parts = []
    if report.get("score") is not None:
        parts.append(f"{report['score']:g}")
    feedback = report.get("feedback")
    if feedback is not None:
        parts.append(feedback if isinstance(feedback, str) else json.dumps(feedback))
    return " ".join(parts)
