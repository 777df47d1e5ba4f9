"""The release workflow over the two stores: propose a candidate, gate it, approve or reject it.

This module is the decision flow; canaries start and end in `reef.releases.canary`, shadows
start in `reef.releases.shadowing`, and the folders it writes are pruned by
`reef.releases.housekeeping`.

Everything here acts on `.reef/experience.db` and `.reef/releases.git` directly, so it works the
same from the CLI with the server stopped, from the CLI while it runs, and from the server's own
routes. A running server notices a moved head by itself.

A candidate never stays `evaluating`: whatever stops its gate (an error, a failed publish, a
cancellation) rejects it, and the process gating it renews its `evaluation_heartbeat_at` (the
database's clock) on a thread of its own, so that `recover_interrupted`, on any replica, ends
the evaluations whose heartbeat stopped (and, on the machine that ran them, those whose process
is gone) and no other. An evaluation is ended released, not rejected, when its release is on
the chain (a push the remote took but reported as failed): with a remote, it is asked first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from reef.artifacts import HARNESS, ROUTING_FILE, files_of, rebased
from reef.config import ReefConfig
from reef.errors import Conflict, ReefError
from reef.evaluation.private import first_private
from reef.evaluation.runner import (
    EvalSettings,
    Generate,
    PairedReport,
    TaskResult,
)
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask
from reef.inference.binding import BASE_BINDING, Binding, binding_for
from reef.inference.routing import (
    BASE,
    SELF,
    Arm,
    RouteSpec,
    Routing,
    check_policy,
    parse_policy,
)
from reef.releases.canary import Canaries
from reef.releases.chain import (
    Release,
    ReleaseChain,
    ReleaseConflict,
    check_path,
    read_folder,
    scenario_of,
)
from reef.releases.door import enter
from reef.releases.gate import Decision, decide
from reef.releases.gating import CandidateEvaluation, GatePromptShown
from reef.releases.housekeeping import Housekeeping, evaluator_running, mark_used
from reef.releases.remote import RemoteUnreachable
from reef.releases.shadowing import SHADOW
from reef.scenario import check_scenario
from reef.store import ExperienceStore
from reef.store.candidates import AGENT_SOURCE, Candidate, CandidateStore
from reef.tracing import Tracing, set_on, traced

log = logging.getLogger("reef.releases")
T = TypeVar("T")

INTERRUPTED = "evaluation was interrupted (the process running it stopped)"
# An evaluation whose heartbeat (every releases.heartbeat_s) was not renewed for HEARTBEAT_MISSES
# intervals is recoverable by any replica.
HEARTBEAT_MISSES = 3


# Where a publish tells the other replicas sharing the store (PostgreSQL's NOTIFY) that a head
# moved; the payload is the scenario.
RELEASES_CHANNEL = "reef_releases"


def tell_replicas(store: ExperienceStore, release: Release) -> None:
    """Tell the replicas listening on the store that `release` heads its scenario now. They also
    poll, so a notification that cannot be sent loses nothing but time."""
    try:
        store.notify(RELEASES_CHANNEL, release.scenario)
    except Exception as error:
        log.warning("could not tell the replicas about %s: %s", release.release_id, error)


class CandidateRefused(ReefError):
    """The artifact could not serve; it is recorded as a rejected candidate saying why."""

    status = 400
    code = "candidate_refused"


class StaleCandidate(ReleaseConflict):
    """A candidate evaluated against a release that no longer heads its scenario."""

    code = "stale_candidate"

    def __init__(self, candidate: Candidate, current: str | None) -> None:
        super().__init__(
            candidate.scenario,
            candidate.base_release_id,
            current,
            f"candidate {candidate.id} was evaluated against the release before. Re-gate it "
            f"against the new head with `reef release regate {candidate.id}`",
        )


# A candidate a human may still decide on, and so re-gate.
REGATABLE = ("held", "proposed", SHADOW)


class ReleaseWorkflow:
    def __init__(self, config: ReefConfig, store: ExperienceStore) -> None:
        self.config = config
        self.chain = ReleaseChain(
            config.releases_git,
            config.releases.remote,
            on_published=lambda release: tell_replicas(store, release),
        )
        self.candidates = CandidateStore(store)
        self.canaries = Canaries(self.chain, self.candidates, self._reject)
        self.housekeeping = Housekeeping(config, self.chain, self.candidates)
        self.checkouts = self.housekeeping.checkouts
        self.candidate_folders = self.housekeeping.candidate_folders
        self.tracing: Tracing | None = None  # when on: each gate and publish is a span
        self.evaluation = CandidateEvaluation(
            config, self.chain, self.candidates, self.binding, self._own_binding
        )

    # -- what serves now ----------------------------------------------------------------------

    def binding(self, release: Release | None) -> Binding:
        """The binding of a release, its files checked out once under .reef/checkouts/."""
        if release is None:
            return BASE_BINDING
        own = self._own_binding(release)
        policy = self.checkouts / release.release_id / ROUTING_FILE
        if not policy.is_file():
            return own
        routes = parse_policy(policy.read_text())
        return dataclasses.replace(own, routing=self._routing(release, own, routes))

    def _own_binding(self, release: Release) -> Binding:
        """What a release's own parts serve, its files checked out once under .reef/checkouts/."""
        folder = self.checkouts / release.release_id
        if folder.is_dir():
            mark_used(folder)
        else:
            self.checkouts.mkdir(parents=True, exist_ok=True)
            self.chain.checkout(release.release_id, folder)
            self.housekeeping.prune_checkouts()
        return binding_for(release.release_id, release.kind, folder)

    def _routing(
        self, release: Release, own: Binding, routes: tuple[RouteSpec, ...]
    ) -> Routing[Binding]:
        """The policy with each arm's binding: `self` this release's own parts, `base` the
        model alone, another release its own parts (never its routing)."""

        def serving(name: str) -> Binding:
            if name == SELF:
                return own
            if name == BASE:
                return BASE_BINDING
            return self._own_binding(self.chain.get(name))

        return Routing(
            release.release_id,
            tuple(
                (route, tuple(Arm(a.name, a.share, serving(a.release)) for a in route.arms))
                for route in routes
            ),
        )

    # -- candidates ---------------------------------------------------------------------------

    def recover_interrupted(self) -> list[Candidate]:
        """End the candidates left `evaluating` by a process that is gone (a crash, a kill):
        rejected, saying why. One whose process still runs (a `reef release publish` in another
        process, evaluating right now) is left to it."""
        ended = []
        stale = self._stale_heartbeats()
        for candidate in self.candidates.list(state="evaluating"):
            if candidate.id not in stale and evaluator_running(candidate):
                continue  # its heartbeat goes on, or its process runs (here) or may (elsewhere)
            # Decided since the listing, or the remote cannot say whether its release landed.
            with contextlib.suppress(Conflict, RemoteUnreachable):
                ended.append(self._end_evaluation(candidate, INTERRUPTED))
        if ended:
            self.housekeeping.prune_candidates()
        return ended

    def _stale_heartbeats(self) -> set[str]:
        """Evaluating candidates whose heartbeat stopped, by the database's clock."""
        return self.candidates.silent_evaluations(
            HEARTBEAT_MISSES * self.config.releases.heartbeat_s
        )

    def beat(self, candidate_id: str) -> bool:
        """Renew an evaluating candidate's heartbeat; whether it is still evaluating."""
        return self.candidates.beat(candidate_id)

    @contextlib.contextmanager
    def heartbeat(self, candidate_id: str) -> Iterator[None]:
        """Renew the candidate's heartbeat on a thread of its own while the block runs (the
        event loop may be busy, a publish may take half an hour)."""
        done = threading.Event()

        def keep_beating() -> None:
            while not done.wait(self.config.releases.heartbeat_s):
                try:
                    if not self.beat(candidate_id):
                        return
                except Exception as error:  # the store is unreachable: try again
                    log.warning("could not renew the heartbeat of %s: %s", candidate_id, error)

        self.beat(candidate_id)
        beating = threading.Thread(target=keep_beating, name=f"heartbeat-{candidate_id}")
        beating.daemon = True
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join(timeout=5)

    def propose(
        self,
        scenario: str,
        kind: str,
        files: dict[str, bytes],
        source: str = "cli",
        reason: str | None = None,
        consumed_record_ids: list[str] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> Candidate:
        """Store a candidate built on the scenario's current head. An artifact that could not
        serve (settings a request would refuse, a LoRA folder without an adapter), or a tree a
        learner or an agent wrote that holds private data (`private_in_tree`), is stored as
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
            metrics=metrics,
        )
        folder = self.candidate_folders / candidate.id
        _write_files(folder, files)
        candidate.files_path = str(folder)
        try:
            binding_for(candidate.id, kind, folder, strict=True)
            if ROUTING_FILE in files:
                check_policy(files[ROUTING_FILE].decode(errors="replace"), self._exists(scenario))
            if source != HUMAN_SOURCE:
                private_in_tree(files)
        except ReefError as error:
            candidate.state, candidate.decision = "rejected", f"refused: {error.message}"
            candidate.unjudged = candidate.records_returned = True  # broken, not the feedback
            self.candidates.add(candidate)
            self.housekeeping.prune_candidates()
            raise CandidateRefused(f"candidate {candidate.id} refused: {error.message}") from None
        return self.candidates.add(candidate)

    def _exists(self, scenario: str) -> Callable[[str], bool]:
        """Whether a release id names a release of `scenario` (for a routing policy's arms)."""

        def exists(release_id: str) -> bool:
            try:
                return scenario_of(release_id) == scenario and bool(self.chain.get(release_id))
            except ReefError:
                return False

        return exists

    async def gate(
        self,
        candidate: Candidate,
        generate: Generate,
        on_task: Callable[[TaskResult], None] | None = None,
        extra_tasks: list[EvalTask] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> Candidate:
        """Evaluate against the current release on the scenario's eval tasks (plus `extra_tasks`)
        and decide. Any error of the evaluation or of publishing rejects, saying why (fail
        closed); a cancellation rejects too, then goes on. `fence()` runs right before a
        release's head moves (a learner's lease, `reef.store.leases.confirm_lease`): when it
        raises, nothing is published and the candidate is rejected unjudged."""
        self.candidates.move(
            candidate.id,
            ("proposed",),
            "evaluating",
            evaluating_pid=os.getpid(),
            evaluating_host=socket.gethostname(),
        )
        policy = self.config.gate_for(candidate.scenario).policy
        attributes = {"reef.candidate.id": candidate.id, "reef.gate.policy": policy}
        try:
            with (
                traced(self.tracing, "reef.gate", **attributes) as span,
                self.heartbeat(candidate.id),
            ):
                gated = await self._evaluate_and_decide(
                    candidate, generate, on_task, extra_tasks or [], fence
                )
                set_on(
                    span, **{"reef.candidate.state": gated.state, "reef.decision": gated.decision}
                )
                return gated
        finally:
            self.housekeeping.prune_candidates()

    async def judge(
        self, candidate: Candidate, generate: Generate
    ) -> tuple[str, str, PairedReport | None]:
        """What the gate would decide on `candidate` now (outcome, why, its report), evaluated
        as `gate` evaluates it, with nothing moved or published: a dry run, for comparing two
        gates on the same candidate (`bench.learning.episodes`)."""
        report = await self.evaluation.evaluate(candidate, generate, None, [])
        outcome, why = decide(self.config.gate_for(candidate.scenario), report)
        return outcome, why, report

    async def _evaluate_and_decide(
        self,
        candidate: Candidate,
        generate: Generate,
        on_task: Callable[[TaskResult], None] | None,
        extra_tasks: list[EvalTask],
        fence: Callable[[], None] | None = None,
    ) -> Candidate:
        try:
            with self._rejected_on_cancel(candidate):
                evaluating = self.evaluation.evaluate(candidate, generate, on_task, extra_tasks)
                report = await self._unless_rejected(candidate.id, evaluating)
        except RejectedMeanwhile:  # a human rejected it while it evaluated: that decision stands
            return self.candidates.get(candidate.id)
        except GatePromptShown as shown:  # judged: what it shows is what it is
            why = f"refused: {shown.message}"
            return self._reject(candidate, ("evaluating",), why, None, judged=True)
        except Exception as error:  # nothing was published: the remote need not be asked
            why = f"evaluation failed: {_named(error)}"
            return self._end_evaluation(candidate, why, reconcile=False)
        outcome, why = decide(self.config.gate_for(candidate.scenario), report)
        outcome, why = self._held_if_an_agents(candidate, outcome, why)
        outcome, why = self._confirmed_live(candidate, outcome, why, report)
        evaluation = report.summary() if report else None
        if evaluation is not None and extra_tasks:  # for a re-gate on the same tasks
            evaluation[GATE_TASKS] = [task.model_dump() for task in extra_tasks]
        if outcome == "rejected":
            return self._reject(candidate, ("evaluating",), why, evaluation, judged=True)
        if outcome == "canary":
            share = self.config.gate_for(candidate.scenario).canary.share
            return self.canaries.start(candidate.id, share, why, evaluation, ("evaluating",))
        if outcome != "released":
            return self.candidates.move(
                candidate.id, ("evaluating",), outcome, decision=why, evaluation=evaluation
            )
        # In a thread: a publish may take long (an LFS push), and the loop goes on meanwhile.
        return await asyncio.to_thread(self._publish, candidate, why, evaluation, fence)

    def _held_if_an_agents(
        self, candidate: Candidate, outcome: Decision, why: str
    ) -> tuple[Decision, str]:
        """An agent's proposal waits for a human whatever the gate says, unless its scenario
        opts in (`gate.agent_proposals: gate`): any inference token can propose."""
        gate = self.config.gate_for(candidate.scenario)
        if candidate.source != AGENT_SOURCE or gate.agent_proposals == "gate":
            return outcome, why
        if outcome in ("released", "canary"):
            said = f"the gate would have {'released' if outcome == 'released' else 'canaried'} it"
            return "held", (
                f"{why}; {said}, but an agent proposed it: held for a human "
                "(gate.agent_proposals: hold)"
            )
        return outcome, why

    def _confirmed_live(
        self, candidate: Candidate, outcome: Decision, why: str, report: PairedReport | None
    ) -> tuple[Decision, str]:
        """A recipe's candidate the gate released for a gain on its users' feedback goes to a
        canary first where the scenario asks (`gate.confirm_live`): live traffic confirms what
        the gate predicted (issue 71: a gate's 6/7 served 1/26). A human's publish, and a
        candidate judged on no feedback, release as the gate said."""
        gate = self.config.gate_for(candidate.scenario)
        automatic = candidate.source not in (HUMAN_SOURCE, AGENT_SOURCE)
        on_feedback = report is not None and any(t.group == FEEDBACK_GROUP for t in report.tasks)
        if outcome != "released" or not gate.confirm_live or not automatic or not on_feedback:
            return outcome, why
        share = gate.canary.share
        return "canary", f"{why}; to be confirmed live: a canary on {share}% (gate.confirm_live)"

    def _publish(
        self,
        candidate: Candidate,
        why: str,
        evaluation: dict[str, Any] | None,
        fence: Callable[[], None] | None,
    ) -> Candidate:
        """Publish a candidate the gate released, and end it either way. All of it on its
        thread, beating: a gate cancelled meanwhile (the await is, the thread is not) leaves a
        publish that goes on to its end and decides the candidate itself, never a candidate
        whose heartbeat stopped while its push may still land."""

        def fenced() -> None:  # right before the head moves
            if not self.beat(candidate.id):  # ended meanwhile (a recovery elsewhere)
                raise Conflict(f"candidate {candidate.id} is no longer evaluating")
            if fence is not None:
                fence()

        with self.heartbeat(candidate.id):
            try:
                return self._release(
                    candidate.id, ("evaluating",), why, evaluation, "reject", fenced
                )
            except Exception as error:  # git-lfs missing, a full disk, a broken chain, a fence
                failed = f"{why}, but publishing failed: {_named(error)}"
                try:
                    return self._end_evaluation(candidate, failed, evaluation)
                except Conflict:  # ended meanwhile by another process (a recovery)
                    return self.candidates.get(candidate.id)

    async def _unless_rejected(self, candidate_id: str, evaluating: Awaitable[T]) -> T:
        """`evaluating`'s result, stopped (cancelled) once the candidate is no longer evaluating
        (`reef release reject` from any process: the store says so), which raises
        `RejectedMeanwhile`. Looked at every `releases.heartbeat_s`."""
        task = asyncio.ensure_future(evaluating)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.releases.heartbeat_s)
                if done:
                    return task.result()
                state = (await asyncio.to_thread(self.candidates.get, candidate_id)).state
                if state != "evaluating":
                    raise RejectedMeanwhile(f"candidate {candidate_id} is {state}")
        finally:  # rejected meanwhile, or the gate itself cancelled: the evaluation stops too
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @contextlib.contextmanager
    def _rejected_on_cancel(self, candidate: Candidate) -> Iterator[None]:
        """On a cancellation (the worker stopped mid-gate) or an interrupt, which are not
        Exceptions: end the candidate rejected, then let the cancellation go on."""
        try:
            yield
        except Exception:
            raise
        except BaseException:
            try:
                why = "evaluation was cancelled before it finished"
                self._end_evaluation(candidate, why, reconcile=False)
            except Exception as error:  # the cancellation matters more; start-up will end it
                log.warning("could not reject interrupted candidate %s: %s", candidate.id, error)
            raise

    def _end_evaluation(
        self,
        candidate: Candidate,
        why: str,
        evaluation: dict[str, Any] | None = None,
        reconcile: bool = True,
    ) -> Candidate:
        """End an `evaluating` candidate that was not decided: rejected, saying why, unless its
        release reached the chain before the failure (then it is released). With a remote and
        `reconcile` (a publish may have been tried: a failed one, or an evaluation interrupted
        who knows where), the remote is asked first (a push it took may have been reported as
        failed); a remote that cannot be reached leaves the candidate evaluating
        (`RemoteUnreachable`): its heartbeat stops, and recovery asks again later."""
        if reconcile and self.chain.remote is not None:
            self.chain.remote.fetch()
        head = self._own_release(candidate)
        if head is not None:
            return self.candidates.move(
                candidate.id,
                ("evaluating",),
                "released",
                decision=head.reason,
                evaluation=head.evaluation,
                release_id=head.release_id,
            )
        return self._reject(candidate, ("evaluating",), why, evaluation, judged=False)

    def _own_release(self, candidate: Candidate) -> Release | None:
        """The release published from `candidate` itself (not a rollback or promote copying
        it), if it is on its scenario's chain."""
        for release in self.chain.releases(candidate.scenario):
            if release.candidate_id == candidate.id and release.origin is None:
                return release
            if release.release_id == candidate.base_release_id:
                break  # older than what it was built on
        return None

    def _reject(
        self,
        candidate: Candidate,
        allowed_from: tuple[str, ...],
        why: str,
        evaluation: dict[str, Any] | None,
        judged: bool,
    ) -> Candidate:
        """Rejected. Judged on its merits (by the gate or a human), its records are spent or
        returned as `gate.rejected_records` says; not judged, they return to learning, so the
        feedback they carry is learned from by a later step instead of being lost."""
        settings = self.config.gate_for(candidate.scenario)
        returned = not judged or settings.rejected_records == "returned"
        if returned and candidate.consumed_record_ids:
            why += f"; {_records_return(candidate)} to learning"
        return self.candidates.move(
            candidate.id,
            allowed_from,
            "rejected",
            decision=why,
            evaluation=evaluation,
            unjudged=not judged,
            records_returned=returned,
        )

    def eval_settings(self, scenario: str) -> EvalSettings:
        """The sampling the gate evaluates `scenario`'s candidates with."""
        return self.evaluation.settings(scenario)

    # -- decisions -----------------------------------------------------------------------------

    def approve(
        self, candidate_id: str, reason: str | None = None, force: bool = False
    ) -> Candidate:
        """A human releases a held (or not yet evaluated) candidate or one in shadow, or
        promotes a canary, through the one door (`reef.releases.door`): one the gate scored
        worse than what served, or never evaluated whole, is refused unless `force`, saying
        what it would override, and the release's reason says it was forced. One built on a
        head that has moved since is refused, saying to re-gate it (`regate`)."""
        candidate = self.candidates.get(candidate_id)
        decidable(candidate, (*REGATABLE, "canary"), "released")
        why = reason or "approved by a human"
        road = "promote" if candidate.state == "canary" else "approve"
        forced = enter(candidate, road, force)
        if forced:
            why += f" ({forced})"
        if candidate.state == "canary":
            return self.canaries.end(candidate_id, promote=True, why=why)
        try:
            approved = self._release(
                candidate.id,
                ("held", "proposed", SHADOW),
                why,
                candidate.evaluation,
                on_conflict="raise",
            )
        except ReleaseConflict as conflict:
            raise StaleCandidate(candidate, conflict.current) from None
        self.housekeeping.prune_candidates()
        return approved

    def canary(
        self, candidate_id: str, share: int, reason: str | None = None, force: bool = False
    ) -> Candidate:
        """A human puts a held candidate on a canary, through the same door as `approve`: a
        canary serves real sessions, so one the gate scored worse needs `force` here too."""
        candidate = self.candidates.get(candidate_id)
        decidable(candidate, ("held", "proposed"), "put on a canary")
        why = reason or "put on a canary by a human"
        forced = enter(candidate, "put on a canary", force)
        if forced:
            why += f" ({forced})"
        return self.canaries.start(candidate_id, share, why)

    def reject(self, candidate_id: str, reason: str) -> Candidate:
        """A human rejects a candidate, or rolls a canary back; its evaluation is kept beside
        the reviewer's reason."""
        candidate = self.candidates.get(candidate_id)
        why = f"rejected by a human: {reason}"
        if candidate.state == "canary":
            return self.canaries.end(candidate_id, promote=False, why=why)
        if candidate.state == "evaluating":  # its gate sees it and stops (`_unless_rejected`)
            why = f"rejected by a human while it was evaluated: {reason}"
        allowed = ("proposed", "evaluating", "held", SHADOW)
        rejected = self._reject(candidate, allowed, why, candidate.evaluation, judged=True)
        self.housekeeping.prune_candidates()
        return rejected

    def rebase(self, candidate_id: str) -> Candidate:
        """A held candidate proposed again on its scenario's head, to be gated against it: the
        parts it changed from its own base, the head's parts it did not touch (a release since
        may have brought an adapter or a harness it must keep). The old candidate is left as it
        is: `regate` supersedes it once the new one's evaluation is complete."""
        old = self.candidates.get(candidate_id)
        if old.state not in REGATABLE:
            raise Conflict(
                f"candidate {candidate_id} is {old.state}; only a held or proposed candidate, "
                "or one in shadow, can be re-gated",
                code="candidate_state",
            )
        if not old.folder.is_dir():
            raise Conflict(f"candidate {candidate_id}'s files were pruned: it cannot be re-gated")
        base = old.base_release_id
        head = self.chain.head(old.scenario)
        kind, files = rebased(
            read_folder(old.folder),
            self.chain.files(base) if base else {},
            self.chain.files(head.release_id) if head else {},
        )
        return self.propose(
            old.scenario,
            kind,
            files,
            source=old.source,
            reason=old.reason,
            consumed_record_ids=old.consumed_record_ids,
            metrics={**(old.metrics or {}), "regated_from": old.id},
        )

    async def regate(
        self,
        candidate_id: str,
        generate: Generate,
        on_task: Callable[[TaskResult], None] | None = None,
    ) -> tuple[Candidate, Candidate]:
        """Gate a held candidate again against its scenario's head, on the tasks its first
        gate had beside the scenario's (the held-out calls, a recipe's own): proposed anew
        (`rebase`) and gated. Only once the new evaluation is complete is the old candidate
        ended as superseded; an interrupted or failed one leaves the old candidate as it was,
        and the new one rejected, unjudged. (old, new)."""
        old = self.candidates.get(candidate_id)
        extra = gate_tasks_of(old)
        new = self.rebase(candidate_id)
        try:
            new = await self.gate(new, generate, on_task, extra_tasks=extra)
        finally:
            if self.candidates.get(new.id).state == "proposed":  # interrupted before its gate
                why = "re-gate interrupted before its evaluation"
                self._reject(self.candidates.get(new.id), ("proposed",), why, None, judged=False)
        if new.unjudged:
            return self.candidates.get(candidate_id), new
        head = new.base_release_id or "base"
        ended = self.candidates.move(
            old.id,
            REGATABLE,
            "rejected",
            decision=f"superseded: re-gated against {head} as {new.id} ({new.state})",
            evaluation=old.evaluation,
            records_returned=False,
        )
        return ended, new

    def _release(
        self,
        candidate_id: str,
        allowed_from: tuple[str, ...],
        why: str,
        evaluation: dict[str, Any] | None,
        on_conflict: str,
        fence: Callable[[], None] | None = None,
    ) -> Candidate:
        candidate = self.candidates.get(candidate_id)
        if candidate.state not in allowed_from:
            raise Conflict(
                f"candidate {candidate_id} is {candidate.state}; only a candidate that is "
                f"{' or '.join(allowed_from)} can be released",
                code="candidate_state",
            )
        try:
            with traced(
                self.tracing, "reef.publish", **{"reef.candidate.id": candidate_id}
            ) as span:
                release = self.chain.publish(
                    candidate.scenario,
                    candidate.kind,
                    read_folder(candidate.folder),
                    candidate.base_release_id,
                    candidate_id=candidate.id,
                    evaluation=evaluation,
                    records_consumed=len(candidate.consumed_record_ids),
                    reason=f"{candidate.reason} (gate: {why})" if candidate.reason else why,
                    fence=fence,
                )
                set_on(span, **{"reef.release.id": release.release_id})
        except ReleaseConflict as conflict:
            if on_conflict == "raise":
                raise
            moved = (
                f"{why}, but it was evaluated against {candidate.base_release_id} and the head "
                f"is now {conflict.current}: propose it again"
            )
            return self._reject(candidate, allowed_from, moved, evaluation, judged=False)
        released = {"decision": why, "evaluation": evaluation, "release_id": release.release_id}
        try:
            return self.candidates.move(candidate_id, allowed_from, "released", **released)
        except Conflict:
            return self._released_after_all(candidate_id, released)

    def _released_after_all(self, candidate_id: str, released: dict[str, Any]) -> Candidate:
        """A candidate whose push landed after a recovery elsewhere ended it unjudged (its
        publisher froze after the fence, past its heartbeat, and the remote did not have the
        release yet): every replica serves it, so it is released after all, its records
        consumed again. Records handed back meanwhile may have been taken by another step."""
        ended = self.candidates.get(candidate_id)
        if ended.state != "rejected" or not ended.unjudged:
            raise Conflict(
                f"candidate {candidate_id} is {ended.state}, though its release is on the chain"
            )
        log.warning("candidate %s: its release landed after it was ended; released", candidate_id)
        decision = f"{released['decision']} (its push landed after a recovery had ended it)"
        return self.candidates.move(
            candidate_id,
            ("rejected",),
            "released",
            **{**released, "decision": decision},
            unjudged=False,
            records_returned=False,
        )


HUMAN_SOURCE = "cli"  # a tree a human published: its support email is theirs to serve


def private_in_tree(files: dict[str, bytes]) -> None:
    """Refuse a tree whose text files hold private data: what a learner or an agent wrote is
    served to every user of the scenario (`reef.evaluation.private`)."""
    # The harness's files serve as text; weights were trained on records checked one by one.
    for path, data in sorted(files_of(files, HARNESS).items()):
        found = first_private(data.decode("utf-8", errors="replace"))
        if found is not None:
            raise CandidateRefused(
                f"{path} holds private data ({found.masked}), which would be served to every "
                "user of the scenario"
            )


class RejectedMeanwhile(Exception):
    """The candidate being evaluated was rejected by a human meanwhile."""


def decidable(candidate: Candidate, states: tuple[str, ...], done: str) -> None:
    """Refuse, before anything else is said of it, a candidate in no state to be `done`: a
    rejected one is not told to use --force first and then that it is rejected."""
    if candidate.state not in states:
        raise Conflict(
            f"candidate {candidate.id} is {candidate.state}; only a candidate that is "
            f"{' or '.join(states)} can be {done}",
            code="candidate_state",
        )


GATE_TASKS = "extra_tasks"  # in an evaluation: the tasks its gate had beside the scenario's


def gate_tasks_of(candidate: Candidate) -> list[EvalTask]:
    """The tasks a candidate's gate evaluated beside its scenario's own (held-out calls, the
    recipe's), for a re-gate to judge it on the same."""
    return gate_tasks_of_evaluation(candidate.evaluation)


def gate_tasks_of_evaluation(evaluation: dict[str, Any] | None) -> list[EvalTask]:
    """The tasks an evaluation's gate had beside its scenario's own."""
    kept = (evaluation or {}).get(GATE_TASKS) or []
    return [EvalTask.model_validate(task) for task in kept if isinstance(task, dict)]


def _records_return(candidate: Candidate) -> str:
    count = len(set(candidate.consumed_record_ids))
    return f"its {count} record returns" if count == 1 else f"its {count} records return"


def _named(error: BaseException) -> str:
    message = error.message if isinstance(error, ReefError) else str(error)
    return f"{type(error).__name__}: {message}"


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
