"""The release workflow over the two stores: propose a candidate, gate it, approve or reject it.

Everything here acts on `.reef/experience.db` and `.reef/releases.git` directly, so it works the
same from the CLI with the server stopped, from the CLI while it runs, and from the server's own
routes. A running server notices a moved head by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.config import ReefConfig
from reef.errors import Conflict, ReefError
from reef.evaluation.runner import EvalSettings, Generate, TaskResult, run_paired
from reef.evaluation.tasks import EvalTask, load_tasks, tasks_path
from reef.inference.binding import BASE_BINDING, Binding, binding_for
from reef.releases.candidates import Candidate, CandidateStore
from reef.releases.chain import Release, ReleaseChain, ReleaseConflict, check_path, read_folder
from reef.releases.gate import decide
from reef.scenario import check_scenario
from reef.store import ExperienceStore


class CandidateRefused(ReefError):
    """The artifact could not serve; it is recorded as a rejected candidate saying why."""

    status = 400
    code = "candidate_refused"


class ReleaseWorkflow:
    def __init__(self, config: ReefConfig, store: ExperienceStore) -> None:
        self.config = config
        self.chain = ReleaseChain(config.releases_git)
        self.candidates = CandidateStore(store)
        self.checkouts = config.state_dir / "checkouts"
        self.candidate_folders = config.state_dir / "candidates"

    # -- what serves now ----------------------------------------------------------------------

    def binding(self, release: Release | None) -> Binding:
        """The binding of a release, its files checked out once under .reef/checkouts/."""
        if release is None:
            return BASE_BINDING
        folder = self.checkouts / release.release_id
        if not folder.is_dir():
            self.checkouts.mkdir(parents=True, exist_ok=True)
            self.chain.checkout(release.release_id, folder)
        return binding_for(release.release_id, release.kind, folder)

    # -- candidates ---------------------------------------------------------------------------

    def recover_interrupted(self) -> list[Candidate]:
        """End candidates that a crash left `evaluating`: rejected, saying why."""
        return [
            self.candidates.move(
                c.id,
                ("evaluating",),
                "rejected",
                decision="evaluation was interrupted (the process running it stopped)",
            )
            for c in self.candidates.list(state="evaluating")
        ]

    def propose(
        self,
        scenario: str,
        kind: str,
        files: dict[str, bytes],
        source: str = "cli",
        reason: str | None = None,
        consumed_record_ids: list[str] | None = None,
    ) -> Candidate:
        """Store a candidate built on the scenario's current head. An artifact that could not
        serve (settings a request would refuse, a LoRA folder without an adapter) is stored as
        rejected, saying why, and refused with `CandidateRefused`."""
        check_scenario(scenario)
        for path in files:
            check_path(path)
        head = self.chain.head(scenario)
        candidate = Candidate(
            scenario=scenario,
            kind=kind,
            files_path="",
            base_release_id=head.release_id if head else None,
            source=source,
            reason=reason,
            consumed_record_ids=consumed_record_ids or [],
        )
        folder = self.candidate_folders / candidate.id
        _write_files(folder, files)
        candidate.files_path = str(folder)
        try:
            binding_for(candidate.id, kind, folder, strict=True)
        except ReefError as error:
            candidate.state, candidate.decision = "rejected", f"refused: {error.message}"
            self.candidates.add(candidate)
            raise CandidateRefused(f"candidate {candidate.id} refused: {error.message}") from None
        return self.candidates.add(candidate)

    async def gate(
        self,
        candidate: Candidate,
        generate: Generate,
        on_task: Callable[[TaskResult], None] | None = None,
        extra_tasks: list[EvalTask] | None = None,
    ) -> Candidate:
        """Evaluate against the current release on the scenario's eval tasks (plus `extra_tasks`)
        and decide. Any error rejects (fail closed)."""
        gate = self.config.gate_for(candidate.scenario)
        self.candidates.move(candidate.id, ("proposed",), "evaluating")
        report = None
        try:
            if gate.policy != "always":
                tasks = self._tasks(candidate.scenario, extra_tasks or [])
                current = self.binding(self._base_release(candidate))
                proposed = binding_for(candidate.id, candidate.kind, candidate.folder)
                settings = self.eval_settings(candidate.scenario)
                report = await run_paired(tasks, current, proposed, generate, settings, on_task)
        except Exception as error:
            return self.candidates.move(
                candidate.id,
                ("evaluating",),
                "rejected",
                decision=f"evaluation failed: {type(error).__name__}: {error}",
            )
        outcome, why = decide(gate, report)
        evaluation = report.summary() if report else None
        if outcome == "released":
            return self._release(
                candidate.id, ("evaluating",), why, evaluation, on_conflict="reject"
            )
        return self.candidates.move(
            candidate.id, ("evaluating",), outcome, decision=why, evaluation=evaluation
        )

    def _tasks(self, scenario: str, extra: list[EvalTask]) -> list[EvalTask]:
        path = tasks_path(self.config.evals_dir, scenario)
        if extra and not path.exists():
            return extra
        return [*load_tasks(path), *extra]

    def eval_settings(self, scenario: str) -> EvalSettings:
        gate = self.config.gate_for(scenario)
        return EvalSettings(gate.temperature, gate.seed, gate.max_tokens)

    def approve(self, candidate_id: str, reason: str | None = None) -> Candidate:
        """A human releases a held (or not yet evaluated) candidate."""
        candidate = self.candidates.get(candidate_id)
        why = reason or "approved by a human"
        return self._release(
            candidate.id, ("held", "proposed"), why, candidate.evaluation, on_conflict="raise"
        )

    def reject(self, candidate_id: str, reason: str) -> Candidate:
        return self.candidates.move(
            candidate_id,
            ("proposed", "held"),
            "rejected",
            decision=f"rejected by a human: {reason}",
        )

    def _base_release(self, candidate: Candidate) -> Release | None:
        if candidate.base_release_id is None:
            return None
        return self.chain.get(candidate.base_release_id)

    def _release(
        self,
        candidate_id: str,
        allowed_from: tuple[str, ...],
        why: str,
        evaluation: dict[str, Any] | None,
        on_conflict: str,
    ) -> Candidate:
        candidate = self.candidates.get(candidate_id)
        if candidate.state not in allowed_from:
            raise Conflict(
                f"candidate {candidate_id} is {candidate.state}; only a candidate that is "
                f"{' or '.join(allowed_from)} can be released",
                code="candidate_state",
            )
        try:
            release = self.chain.publish(
                candidate.scenario,
                candidate.kind,
                read_folder(candidate.folder),
                candidate.base_release_id,
                candidate_id=candidate.id,
                evaluation=evaluation,
                records_consumed=len(candidate.consumed_record_ids),
                reason=f"{candidate.reason} (gate: {why})" if candidate.reason else why,
            )
        except ReleaseConflict as conflict:
            if on_conflict == "raise":
                raise
            return self.candidates.move(
                candidate_id,
                allowed_from,
                "rejected",
                evaluation=evaluation,
                decision=f"{why}, but it was evaluated against {candidate.base_release_id} and "
                f"the head is now {conflict.current}: propose it again",
            )
        return self.candidates.move(
            candidate_id,
            allowed_from,
            "released",
            decision=why,
            evaluation=evaluation,
            release_id=release.release_id,
        )


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
