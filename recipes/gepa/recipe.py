"""gepa: reflective prompt evolution with a Pareto front (Agrawal et al., arXiv 2507.19457).

A step turns the batch's scored turns into tasks (each prompt, scored by `scorer`, with the
user's feedback on it), and runs GEPA's search (search.py) from the current harness tree: a pool
of trees scored on the Pareto tasks; each iteration draws a parent from the Pareto front of
per-task winners, runs it on a minibatch, and asks the proposer model to rewrite one component
(`components`, in turn: the system prompt AGENTS.md, a rule file, a skill) from what it read: the
prompts, the answers, their scores and the feedback. The child is scored on the Pareto tasks
only if it beats its parent on the same minibatch; the search stops at `max_metric_calls`
answers scored. The best tree by its mean on the Pareto tasks is proposed when it beats the
current tree there; the gate then decides on the scenario's eval tasks (strictly better under
`no_regression`, as GEPA publishes only on a gain on its validation set).

Where ours differs from the paper: the pool lives for one step (the next step starts again from
the released tree and new traffic); the Pareto and feedback tasks are the batch's own prompts
(`pareto_size` of them, the rest feedback only; the paper splits a training set); the metric is
the scenario's scorer, and the feedback text the user's report on the prompt beside the score.

With `episodes` set, the tasks are a suite of Harbor tasks instead and every tree is scored by
the agent's episodes under it, their traces the feedback (`reef.sdk.prompt_search`).
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from reef.sdk import (
    HARNESS,
    PromptSearch,
    PromptSearchSettings,
    Proposal,
    ProposalRefused,
    SearchTask,
    StepContext,
    Trajectory,
)

from .search import Rollout, SearchResult, Tree, search

COMPONENTS = {
    "system_prompt": "AGENTS.md",
    "rules": "rules/gepa.md",
    "skill": "skills/gepa/SKILL.md",
}
MAX_COMPONENT_CHARS = 800

REFLECTION_PROMPT = """You are improving the instructions an AI assistant is given, one part of \
them at a time. The part to rewrite is {path}. Its text now:
```
{current}
```
The assistant answered these requests with the instructions as they are; each answer was scored \
(1 is what the user wants) and the user said what they wanted:
{rollouts}
Write the new text of {path}: keep what works, and say plainly what the assistant must do \
differently so that every answer meets what the users asked for. Reply with only a JSON object: \
{{"text": "..."}}"""


class GEPASettings(PromptSearchSettings):
    components: list[Literal["system_prompt", "rules", "skill"]] = Field(
        default_factory=lambda: ["system_prompt", "rules"]  # type: ignore[arg-type]
    )
    minibatch_size: int = Field(3, ge=1)
    max_metric_calls: int = Field(60, ge=1)
    skip_perfect_score: bool = True
    pareto_size: int = Field(6, ge=1)  # the first tasks score every candidate; the rest feed back


class GEPA(PromptSearch):
    name = "gepa"
    experience = "reactive, from live traffic; metric calls on the served model"
    Settings = GEPASettings
    settings: GEPASettings

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        turns = self.scored_turns(batch)
        tasks = self.search_tasks(turns, context)
        pareto = list(range(min(self.settings.pareto_size, len(tasks))))
        seed_tree = context.files_of(HARNESS)
        found = search(
            seed_tree,
            [COMPONENTS[name] for name in self.settings.components],
            pareto,
            list(range(len(tasks))),
            lambda tree, chosen: self._evaluate(context, tree, tasks, chosen),
            lambda tree, path, rollouts: self._reflect(context, tree, path, rollouts),
            max_metric_calls=self.settings.max_metric_calls,
            minibatch_size=self.settings.minibatch_size,
            skip_perfect_score=self.settings.skip_perfect_score,
            rng_seed=self.settings.seed,
            on_progress=lambda done, total: (
                context.progress("metric calls", done, total, None) if context.progress else None
            ),
        )
        best = found.pool[found.best]
        if found.best == 0 or best.mean <= found.pool[0].mean:
            raise ProposalRefused(
                f"no tree beat the current one on the {len(pareto)} Pareto task(s) "
                f"({found.metric_calls} metric calls; {_tally(found)})"
            )
        return Proposal(
            kind="harness",
            files=best.tree,
            reason=(
                f"GEPA: {best.component} rewritten ({len(found.pool)} trees; Pareto mean "
                f"{found.pool[0].mean:.2f} -> {best.mean:.2f} in {found.metric_calls} calls)"
            ),
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            metrics={
                "metric_calls": found.metric_calls,
                "pool": len(found.pool),
                "pareto_mean": [found.pool[0].mean, best.mean],
                "curve": found.curve,
                "rejected_on_minibatch": found.rejected_on_minibatch,
                "skipped_perfect": found.skipped_perfect,
            },
        )

    def _evaluate(
        self,
        context: StepContext,
        tree: Tree,
        tasks: list[SearchTask],
        chosen: list[int],
    ) -> list[Rollout]:
        rollouts = []
        for index in chosen:
            answer, scored = self.answer(context, tree, tasks[index])
            rollouts.append(Rollout(index, tasks[index].prompt, answer, scored, tasks[index].said))
        return rollouts

    def _reflect(
        self, context: StepContext, tree: Tree, path: str, rollouts: list[Rollout]
    ) -> Tree | None:
        assert context.ask is not None
        shown = "\n".join(
            f"- request: {r.prompt[:300]!r}\n  answer: {r.answer[:300]!r}\n"
            f"  score: {r.score:g}; the user said: {r.feedback[:300]}"
            for r in rollouts
        )
        current = tree.get(path, b"").decode(errors="replace") or "(empty: not written yet)"
        prompt = REFLECTION_PROMPT.format(path=path, current=current[:1500], rollouts=shown)
        schema = {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 600}},
            "required": ["text"],
            "additionalProperties": False,
        }
        reply = context.ask(
            [{"role": "user", "content": prompt}], json_schema=schema, max_tokens=700
        )
        try:
            text = str(json.loads(reply)["text"]).strip()
        except (ValueError, KeyError, TypeError):
            return None
        if not text:
            return None
        child = dict(tree)
        child[path] = (text[:MAX_COMPONENT_CHARS] + "\n").encode()
        return child


def _tally(found: SearchResult) -> str:
    return (
        f"{found.rejected_on_minibatch} child(ren) lost on their minibatch, "
        f"{found.skipped_perfect} minibatch(es) already perfect, "
        f"{found.unusable_reflections} reflection(s) unusable"
    )
