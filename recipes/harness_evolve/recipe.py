"""harness_evolve: improve a scenario's harness from the calls its users scored low.

A step takes the window of failing turns (score below `threshold`, or feedback without a score),
asks a proposer to reflect on them and propose one mutation (create, update or remove a rule,
skill, example set or the prompt), and applies it to a copy of the current tree. The worker
then gates the candidate: paired episodes of current and candidate on the scenario's eval tasks,
plus the held-out failing calls (which no step learns from) when a `scorer` is set. Winners are
released with their reason; losers stay as rejected candidates, and their reasons are shown to
the proposer next time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reef.sdk import (
    HARNESS,
    Evaluated,
    ExperienceView,
    ProgramScorer,
    Proposal,
    Recipe,
    RecipeError,
    RecipeSettings,
    StepContext,
    Trajectory,
    Turn,
    asking,
    content_judge_for,
    demonstrations,
    files_of,
)

from .mutations import MutationRefused, apply
from .proposers import HindsightProposer, ModelProposer, RuleProposer


class HarnessEvolveSettings(RecipeSettings):
    batch_size: int = 2
    threshold: float = 0.5
    # llm: a model reflects and proposes a mutation (learning.proposer_*); hindsight: answers
    # users wrote (demonstrations), and the served model's rewrites of its failing answers and
    # answers with the feedback in view, those that meet `scorer`, become worked examples; rule:
    # the feedback becomes a rule.
    proposer: Literal["llm", "hindsight", "rule"] = "llm"
    max_examples: int = 4
    hindsight_samples: int = Field(4, ge=1, le=16)
    # Rewrites of a failing answer asked under its feedback (0: none), of the served model or of
    # the proposer model (learning.proposer_*: a stronger one, where configured).
    hindsight_revisions: int = Field(2, ge=0, le=16)
    reviser: Literal["served", "proposer"] = "served"
    # Whether a hindsight answer still answers the question: by its words (within one language),
    # or as the proposer model judges it (in any language: for a preference such as French).
    content_check: Literal["words", "proposer"] = "words"
    # Scores the held-out failing calls as extra gate tasks, and hindsight answers; without it only
    # evals/<scenario>.jsonl runs and the served model judges hindsight answers.
    scorer: ProgramScorer | None = None
    # incumbent: mutate the current release; pareto: mutate a tree from the Pareto set of earlier
    # candidates across tasks (GEPA-style), so strengths on different tasks are all explored.
    selection: Literal["incumbent", "pareto"] = "incumbent"


class HarnessEvolve(Recipe):
    name = "harness_evolve"
    signal = "scores below a threshold and feedback text"
    reads_feedback_text = True
    experience = "reactive, from live traffic"
    target = "harness"
    Settings = HarnessEvolveSettings
    settings: HarnessEvolveSettings

    def failing(self, turn: Turn) -> bool:
        """A turn to learn from: scored below the threshold (unscored: with feedback); with the
        hindsight proposer, also a turn shown the answer wanted, whatever its score (the
        scenario's teacher reports each answer it gives as a demonstration, and the user may
        score that answer well)."""
        if self.settings.proposer == "hindsight" and demonstrations(turn):
            return True
        score = turn.score
        return score < self.settings.threshold if score is not None else bool(turn.feedback)

    def failing_turns(self, trajectories: list[Trajectory]) -> list[Turn]:
        return [turn for t in trajectories for turn in t.turns if self.failing(turn)]

    def ready(self, view: ExperienceView) -> bool:
        return len(self.failing_turns(view.trajectories)) >= self.settings.batch_size

    def waiting_for(self, view: ExperienceView) -> str | None:
        found = len(self.failing_turns(view.trajectories))
        return (
            f"{found} of the {self.settings.batch_size} failing turns a batch needs (scored "
            f"below {self.settings.threshold:g}, or feedback without a score)"
        )

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        batch: list[Trajectory] = []
        for trajectory in view.trajectories:
            if any(self.failing(turn) for turn in trajectory.turns):
                batch.append(trajectory)
            if len(self.failing_turns(batch)) >= self.settings.batch_size:
                break
        return batch

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        failures = self.failing_turns(batch)
        if self.settings.proposer == "rule":
            proposal = RuleProposer().propose(failures, context)
        elif self.settings.proposer == "hindsight":
            if context.generate is None:
                raise RecipeError("the hindsight proposer needs the served model: none was given")
            # The proposer model revises where the settings choose it, else the served model.
            ask = context.ask if self.settings.reviser == "proposer" else None
            proposer = HindsightProposer(
                context.generate,
                self.settings.scorer,
                self.settings.max_examples,
                self.settings.hindsight_samples,
                self.settings.hindsight_revisions,
                asking(ask) if ask is not None else None,
                content_judge_for(self.settings.content_check, context.ask),
            )
            proposal = proposer.propose(failures, context)
        else:
            if context.ask is None:
                raise RecipeError("the llm proposer needs a model: the worker gives none")
            proposal = ModelProposer(context.ask).propose(failures, context)
        if isinstance(proposal, str):
            raise MutationRefused(proposal)
        files = apply(self.parent(context), proposal)
        return Proposal(
            kind="harness",
            files=files,
            reason=f"{proposal.op} {proposal.path}: {proposal.reason}",
            consumed_record_ids=[r for t in batch for r in t.record_ids],
        )

    def parent(self, context: StepContext) -> dict[str, bytes]:
        """The tree to mutate: the current one, or one from the Pareto set, in turn."""
        if self.settings.selection == "incumbent":
            return context.files_of(HARNESS)
        front = pareto_front(context.evaluated)
        if not front:
            return context.files_of(HARNESS)
        return files_of(front[len(context.evaluated) % len(front)].files, HARNESS)


def pareto_front(evaluated: list[Evaluated]) -> list[Evaluated]:
    """Candidates no other candidate beats on every task it shares with them (ties kept)."""

    def dominates(a: Evaluated, b: Evaluated) -> bool:
        shared = a.scores.keys() & b.scores.keys()
        return (
            bool(shared)
            and all(a.scores[t] >= b.scores[t] for t in shared)
            and any(a.scores[t] > b.scores[t] for t in shared)
        )

    return [c for c in evaluated if not any(dominates(o, c) for o in evaluated if o is not c)]
