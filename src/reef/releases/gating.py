"""The gate's evaluation of one candidate: on what it is scored, against what, and how.

`CandidateEvaluation` answers the `PairedReport` a decision reads (`reef.releases.gate.decide`):
the candidate and what serves now answer the scenario's eval tasks side by side (its own, the
project's others when it has few, a recipe's extra tasks, the held-back good answers of its
traffic), or run the gate's episodes; each task is held to the best score a release of the
scenario reached; and each release a candidate's routing policy sends sessions to answers the
chat tasks beside them. The workflow (`reef.releases.workflow`) moves the candidate and
publishes; this module only measures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from reef.artifacts import ROUTING_FILE
from reef.config import EpisodeGateConfig, ReefConfig
from reef.engines import resolve_kind
from reef.episodes.gate import judge_by_episodes
from reef.errors import NotFound, ReefError
from reef.evaluation.held_out import leaked, shown_prompts
from reef.evaluation.judge import FeedbackJudge, judge_body, judged, remote_ask
from reef.evaluation.reference import Reference, best_released, hold_to
from reef.evaluation.replay import replay_tasks
from reef.evaluation.runner import (
    EVAL_CONCURRENCY,
    EvalSettings,
    Generate,
    PairedReport,
    RoutedArm,
    TaskResult,
    as_candidate,
    beside_traffic,
    run_beside,
    run_paired,
)
from reef.evaluation.served import served_settings
from reef.evaluation.tasks import EvalTask, EvalTasksError, load_tasks, tasks_path
from reef.inference.binding import BASE_BINDING, Binding, binding_for
from reef.inference.routing import BASE, SELF, parse_policy
from reef.protocol import ChatRequest
from reef.releases.chain import Release, ReleaseChain
from reef.store.candidates import Candidate, CandidateStore

# What serves a release: its binding (with its routing policy), or its own parts alone.
Bind = Callable[[Release | None], Binding]
BindOwn = Callable[[Release], Binding]


class CandidateEvaluation:
    def __init__(
        self,
        config: ReefConfig,
        chain: ReleaseChain,
        candidates: CandidateStore,
        binding: Bind,
        own_binding: BindOwn,
    ) -> None:
        self.config = config
        self.chain = chain
        self.candidates = candidates
        self.binding = binding
        self.own_binding = own_binding

    def settings(self, scenario: str) -> EvalSettings:
        """How the tasks are answered: as `scenario` is served (`reef.evaluation.served`)."""
        return served_settings(self.candidates.store, scenario, self.config.gate_for(scenario))

    async def evaluate(
        self,
        candidate: Candidate,
        generate: Generate,
        on_task: Callable[[TaskResult], None] | None,
        extra_tasks: list[EvalTask],
    ) -> PairedReport | None:
        """The candidate against what its scenario served when it was proposed; None under
        the `always` policy, which evaluates nothing."""
        gate = self.config.gate_for(candidate.scenario)
        if gate.policy == "always":
            return None
        current = self.binding(self._base_release(candidate))
        proposed = binding_for(candidate.id, candidate.kind, candidate.folder)
        settings = self.settings(candidate.scenario)
        concurrency = gate_concurrency(self.config)
        chat = gate.episodes is None or gate.episodes.with_chat
        tasks = self.tasks(candidate.scenario, extra_tasks) if chat else []
        refuse_shown(tasks, proposed, current)
        judge = feedback_judge(self.config, candidate.scenario, generate) if judged(tasks) else None
        report = await run_paired(
            tasks, current, proposed, generate, settings, on_task, concurrency, judge
        )
        if gate.episodes is not None:
            episodes = await asyncio.to_thread(self._episode_results, candidate, gate.episodes)
            for result in episodes:
                if on_task:
                    on_task(result)
            report.tasks += episodes
        hold_to(report, self._best_released(candidate.scenario, settings.answers_per_task > 1))
        for name, release, share in _routed_releases(candidate):
            if release == (candidate.base_release_id or BASE):
                answered = as_candidate(report)  # the current side answered as it serves
            else:  # on the chat tasks: episodes run only the candidate and the current tree
                arm = self._arm_binding(release)
                chat_side = PairedReport(report.current_release_id, report.tasks[: len(tasks)])
                answered = await run_beside(
                    chat_side, tasks, arm, generate, settings, concurrency, judge
                )
            report.arms.append(RoutedArm(name, release, share, answered))
        return report

    def tasks(self, scenario: str, extra: list[EvalTask]) -> list[EvalTask]:
        """The scenario's eval tasks; the project's other eval files when it has few of its
        own; the recipe's `extra` tasks; and the held-back good answers of its traffic."""
        gate = self.config.gate_for(scenario)
        path = tasks_path(self.config.evals_dir, scenario)
        own = load_tasks(path) if path.exists() else []
        if len(own) < gate.min_tasks:
            own += [t for other in self._other_eval_files(path) for t in load_tasks(other)]
        replayed = replay_tasks(self.candidates.store, scenario, gate.replay_threshold, gate.replay)
        tasks = [*own, *extra, *replayed]
        if not tasks:
            raise EvalTasksError(
                f"no eval tasks at {path}: write one JSON task per line (see `reef init`'s example)"
            )
        return tasks

    def _base_release(self, candidate: Candidate) -> Release | None:
        if candidate.base_release_id is None:
            return None
        return self.chain.get(candidate.base_release_id)

    def _other_eval_files(self, own: Path) -> list[Path]:
        folder = self.config.evals_dir
        return sorted(p for p in folder.glob("*.jsonl") if p != own) if folder.is_dir() else []

    def _episode_results(
        self, candidate: Candidate, episodes: EpisodeGateConfig
    ) -> list[TaskResult]:
        """The gate's episodes (`reef.episodes.gate`), against the server this project runs."""
        return judge_by_episodes(episodes, self.config, candidate.scenario, candidate.id)

    def _best_released(self, scenario: str, sampled: bool) -> dict[str, Reference]:
        """Per task, the best score a release of `scenario` reached, on either side of the
        evaluations that released them answered the same way (`sampled`, or greedy;
        `reef.evaluation.reference`). The whole chain counts, so a rollback lowers nothing; a
        canary's release counts once its candidate is released (promoted), never while it runs
        or after it was rolled back."""
        return best_released(
            (
                (release.release_id, release.evaluation)
                for release in self.chain.releases(scenario)
                if release.evaluation and self._was_released(release)
            ),
            sampled,
        )

    def _was_released(self, release: Release) -> bool:
        if release.candidate_id is None:
            return True
        try:
            return self.candidates.get(release.candidate_id).state == "released"
        except NotFound:
            return True  # a candidate no longer stored: its release stands

    def _arm_binding(self, release: str) -> Binding:
        """What a routed arm serves: the model alone, or a release's own parts."""
        return BASE_BINDING if release == BASE else self.own_binding(self.chain.get(release))


def feedback_judge(config: ReefConfig, scenario: str, generate: Generate) -> FeedbackJudge:
    """The judge of the tasks written in plain words (`reef.evaluation.judge`): the scenario's
    teacher, else the proposer model, else the served model alone (no adapter, no harness:
    neither side's own)."""
    teacher = config.teacher_for(scenario)
    if teacher.url:
        named = f"the teacher ({teacher.model or 'its default model'})"
        ask = remote_ask(teacher.url, teacher.model, teacher.api_key_env, teacher.timeout_s)
        return FeedbackJudge(named, ask)
    learning = config.learning
    if learning.proposer_url:
        proposer = learning.proposer_model or "its default model"
        ask = remote_ask(
            learning.proposer_url, learning.proposer_model, learning.proposer_api_key_env, 300
        )
        return FeedbackJudge(f"the proposer model ({proposer})", ask)

    async def served(prompt: str) -> str:
        return await generate(ChatRequest.model_validate(judge_body(prompt)), BASE_BINDING)

    return FeedbackJudge("the served model alone", served)


def _routed_releases(candidate: Candidate) -> list[tuple[str, str, int]]:
    """The releases other than its own parts that the candidate's routing policy sends sessions
    to: (the first arm's name, the release, the largest share of a route it serves), in order."""
    policy = candidate.folder / ROUTING_FILE
    if not policy.is_file():
        return []
    routed: dict[str, tuple[str, int]] = {}
    for route in parse_policy(policy.read_text()):
        for arm in route.arms:
            if arm.release == SELF or arm.share == 0:
                continue
            name, share = routed.get(arm.release, (arm.name, 0))
            routed[arm.release] = (name, max(share, arm.share))
    return [(name, release, share) for release, (name, share) in routed.items()]


class GatePromptShown(ReefError):
    """A candidate whose worked examples answer a prompt the gate would judge it on."""

    status = 400
    code = "gate_prompt_shown"


def refuse_shown(tasks: list[EvalTask], proposed: Binding, current: Binding) -> None:
    """Refuse a candidate whose worked examples (`examples.jsonl`) answer one of the gate's
    prompts that the current release's do not: it would pass that task by showing the answer,
    which says nothing of the next user's question. (An example both show favours neither.)"""
    new = shown_prompts(proposed.examples) - shown_prompts(current.examples)
    shown = leaked(tasks, new)
    if shown:
        named = ", ".join(task.id for task in shown[:5])
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        raise GatePromptShown(
            f"its worked examples answer {len(shown)} of the gate's prompts ({named}{more}): "
            "a candidate is never judged on an answer it shows"
        )


def gate_concurrency(config: ReefConfig) -> int:
    """Evaluation requests in flight at once: on llama.cpp, a batch that leaves a slot to live
    traffic; other engines batch on their own side (vLLM) or are remote (upstream)."""
    kind, _ = resolve_kind(config.engine)
    if kind == "llamacpp":
        return beside_traffic(config.engine.llamacpp.slots)
    return EVAL_CONCURRENCY
