"""tttd: test-time training to discover (TTT-Discover), on a task whose answers a program verifies.

The experience is the recipe's own: rollouts of the served model (under the current release)
from starting states, each scored by the task's verifier. A step:

1. chooses up to `starts` starting states from the archive by PUCT (`archive.py`), none an
   ancestor or a descendant of another: the task's seeded starting state the first time;
2. samples a group of `group_size` rollouts from each, at `temperature`, and verifies each;
   each new state enters the archive as a child of its start, unless the archive holds the same
   centres or the start keeps `children_per_state` children as good; the archive keeps the best
   `archive_size`;
3. gives each rollout its entropic advantage within its group, β chosen per group so that
   KL(q_β ‖ uniform) = ln 2 (`advantages.py`); groups whose rewards are all equal are skipped
   and counted;
4. trains the LoRA one policy update (`reef.training.policy`: the clipped loss with a KL penalty
   to the base), continuing the scenario's adapter, and proposes it. The gate asks candidate and
   current for a packing from the best state found, scored by the verifier.

The archive, the best state's drawing (`best.png`) and each step's figures (`history`) are kept
in the recipe's work folder, `.reef/learning/tttd/`, across steps and restarts: what was
discovered is kept whether or not a candidate is released. The shipped task is circle packing
(`circles.py`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from reef.sdk import (
    EvalTask,
    ExperienceView,
    LoraRecipeSettings,
    ProposalRefused,
    RecipeError,
    ScorerSpec,
    StepContext,
    Trajectory,
    WeightRecipe,
    WeightStep,
    answer_text,
    policy_update,
)

from . import circles
from .advantages import entropic_advantages
from .archive import Archive, State

if TYPE_CHECKING:
    from reef.sdk import TrainedAdapter

log = logging.getLogger("reef.learning")
SCORER = ScorerSpec(type="python", function="reef.recipes.tttd.circles:score_answer")


class TTTDSettings(LoraRecipeSettings):
    circles: int = Field(26, ge=2, le=64)
    start_seed: int = 0  # seeds the first starting state
    starts: int = Field(2, ge=1, le=16)  # starting states per step
    group_size: int = Field(4, ge=3, le=32)  # rollouts per starting state
    temperature: float = Field(1.0, gt=0, le=2)
    max_tokens: int = Field(320, ge=16)
    archive_size: int = Field(16, ge=1)
    exploration: float = Field(1.0, ge=0)  # c in the PUCT score
    children_per_state: int = Field(2, ge=1)  # children a state keeps in the archive, the best
    kl_beta: float = Field(0.02, ge=0)
    # The LoRA run's other settings come from LoraRecipeSettings.
    steps: int = Field(4, ge=1)  # gradient steps on each step's rollouts


class TTTDiscover(WeightRecipe):
    name = "tttd"
    signal = "a verifier's reward on the model's own rollouts"
    experience = "self-generated, from an archive of the best states found"
    Settings = TTTDSettings
    settings: TTTDSettings
    waits_for_traffic = False
    training = "training a LoRA (policy)"

    def ready(self, view: ExperienceView) -> bool:
        return True  # its experience is its own rollouts: it never waits for traffic

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return []  # consumes no records

    # -- a step ---------------------------------------------------------------------------------

    def plan(self, batch: list[Trajectory], context: StepContext) -> WeightStep:
        """Rollouts from the archive's chosen states, the archive grown by them, and a policy
        example per rollout of a group whose rewards differ."""
        assert context.work_dir is not None
        archive = self.archive(context.work_dir)
        starts = archive.choose(self.settings.starts)
        examples: list[Any] = []
        groups: list[dict[str, Any]] = []
        for index, start in enumerate(starts):
            rollouts = self._rollouts(start, archive, context, index, len(starts))
            group = self._group(start, rollouts, examples)
            archive.expanded(start.id, group["rewards"])
            groups.append(group)
        self._keep(archive, starts, groups, context.work_dir)
        skipped = sum(g["beta"] is None for g in groups)
        if not examples:
            raise ProposalRefused(f"all {skipped} group(s) had equal rewards: nothing to learn")
        best = archive.best
        task = EvalTask(
            id="tttd:best",
            messages=[{"role": "user", "content": circles.prompt(as_centres(best))}],
            scorer=SCORER,
        )
        return WeightStep(examples, [], facts=dict(archive.history[-1]), eval_tasks=[task])

    def summary(self, step: WeightStep) -> str:
        facts = step.facts
        return (
            f"entropic policy update on {len(step.examples)} rollout(s) from "
            f"{len(facts['groups'])} state(s) ({facts['skipped_groups']} group(s) skipped), "
            f"best sum of radii {facts['best']:.4f}"
        )

    def train(
        self, step: WeightStep, base: Any, context: StepContext, resume_from: Path | None
    ) -> TrainedAdapter:
        return policy_update(
            self.settings, base, step.examples, self.on_step(context), resume_from, max_length=1024
        )

    def archive(self, work_dir: Path) -> Archive:
        """The archive kept in the work folder, or a new one holding the starting state."""
        path = work_dir / "archive.json"
        if path.is_file():
            return Archive.load(path)
        settings = self.settings
        archive = Archive(settings.archive_size, settings.exploration, settings.children_per_state)
        state = circles.starting_state(settings.circles, settings.start_seed)
        archive.add([list(c) for c in state], circles.reward(state))
        return archive

    def _rollouts(
        self, start: State, archive: Archive, context: StepContext, index: int, total: int
    ) -> list[tuple[Any, float, list[list[float]]]]:
        """`group_size` answers from `start`: each completion, its reward and its centres."""
        assert context.generate is not None
        messages = [{"role": "user", "content": circles.prompt(as_centres(start))}]
        rollouts = []
        for number in range(self.settings.group_size):
            body = {
                "messages": messages,
                "temperature": self.settings.temperature,
                "max_tokens": self.settings.max_tokens,
                "seed": self.settings.seed + archive.expansions * 1000 + number,
            }
            completion = context.generate(body)
            centres = circles.parse_centres(answer_text(completion), as_centres(start))
            rollouts.append((completion, circles.reward(centres), [list(c) for c in centres]))
            if context.progress is not None:
                done = index * self.settings.group_size + number + 1
                context.progress("sampling rollouts", done, total * self.settings.group_size, None)
        return rollouts

    def _group(
        self, start: State, rollouts: list[tuple[Any, float, list[list[float]]]], examples: list
    ) -> dict[str, Any]:
        """Each rollout's advantage, appended to `examples` as a policy example; the group's
        figures for the history."""
        from reef.sdk import PolicyExample

        rewards = [reward for _, reward, _ in rollouts]
        weighted = entropic_advantages(rewards)
        if weighted is not None:
            advantages = weighted[0]
            for (completion, _, _), advantage in zip(rollouts, advantages, strict=True):
                if not completion.token_ids or not completion.prompt_token_ids:
                    raise RecipeError("the engine does not report token ids: tttd needs them")
                example = PolicyExample.sequence(
                    completion.prompt_token_ids, completion.token_ids, advantage
                )
                served = completion.token_logprobs
                if served and len(served) == len(completion.token_ids):
                    example.behaviour_logprobs = list(served)  # sampled by the engine, not here
                examples.append(example)
        return {
            "start": start.id,
            "rewards": rewards,
            "beta": weighted[1] if weighted else None,
            "centres": [centres for _, _, centres in rollouts],
        }

    def _keep(
        self, archive: Archive, starts: list[State], groups: list[dict[str, Any]], work_dir: Path
    ) -> None:
        """New states into the archive as children of their start (copies and children beyond
        the cap left out), the step into its history, both saved; best.png drawn."""
        for start, group in zip(starts, groups, strict=True):
            for centres, reward in zip(group.pop("centres"), group["rewards"], strict=True):
                archive.add(centres, reward, parent=start)
        archive.history.append(
            {
                "step": len(archive.history) + 1,
                "best": archive.best.reward,
                "step_best": max(r for g in groups for r in g["rewards"]),
                "groups": groups,
                "skipped_groups": sum(g["beta"] is None for g in groups),
            }
        )
        archive.save(work_dir / "archive.json")
        best = archive.best
        circles.draw(
            circles.grown(as_centres(best)),
            work_dir / "best.png",
            f"{len(best.centres)} circles, sum of radii {best.reward:.4f}",
        )
        log.info("tttd: step %d, best %.4f", len(archive.history), best.reward)


def as_centres(state: State) -> circles.Centres:
    return [(float(x), float(y)) for x, y in state.centres]
