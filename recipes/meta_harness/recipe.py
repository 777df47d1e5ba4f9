"""meta_harness: a search over whole harness trees, the proposer reading the full history.

A step turns the batch's scored turns into tasks (as `gepa` does: each prompt, scored by
`scorer`, with the user's feedback on it) and grows a history of trees, each scored on every
task. Each new node is a complete tree the proposer model writes (its `AGENTS.md` and a rule
file) after reading the history: in `full_history` mode every retained node (its files, its
mean, its score on each task, a few of its answers and their feedback), in `incumbent_only` mode
the best node alone. At most `max_candidates` nodes are retained (the best by mean, the seed
always), and at most `max_nodes` are written in a step.

The best node is proposed only when the evidence says it beats the current tree: its paired
per-task differences against the seed give a one-sided confidence (a normal approximation to the
mean difference over its standard error), and below `min_confidence` the step decides nothing,
saying on how many tasks the decision would have rested. The gate then judges the candidate on
the scenario's own tasks. With `episodes` set, the tasks are a suite of Harbor tasks and every
node is scored by the agent's episodes under it (`reef.sdk.prompt_search`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
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

RULE_PATH = "rules/meta_harness.md"
MAX_FILE_CHARS = 800
TREE_SCHEMA = {
    "type": "object",
    "properties": {
        "agents_md": {"type": "string", "minLength": 1, "maxLength": 600},
        "rules": {"type": "string", "maxLength": 600},
    },
    "required": ["agents_md", "rules"],
    "additionalProperties": False,
}
PROPOSER_PROMPT = """You design the instructions an AI assistant is given: its AGENTS.md and one \
rule file. Below are the designs tried so far, each with its mean score (1 is what the users \
want), its score on each request, and some of its answers with what the users said.
{history}
Write a new, complete design that should score higher on every request. Reply with only a JSON \
object: {{"agents_md": "...", "rules": "..."}}"""


class MetaHarnessSettings(PromptSearchSettings):
    mode: Literal["full_history", "incumbent_only"] = "full_history"
    max_nodes: int = Field(6, ge=1)  # trees the proposer writes in a step
    max_candidates: int = Field(4, ge=1)  # nodes retained (and shown), the seed among them
    # The one-sided confidence, from the paired per-task differences, that the best node beats
    # the current tree; below it the step proposes nothing.
    min_confidence: float = Field(0.9, gt=0.5, lt=1.0)
    # The longest history the proposer is shown, in characters (about 4 a token): the designs
    # that do not fit are left out, the best kept.
    history_chars: int = Field(1800, ge=200)


@dataclass
class Node:
    tree: dict[str, bytes]
    scores: list[float]
    answers: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores) if self.scores else 0.0


def confidence(better: list[float], baseline: list[float]) -> float:
    """One-sided confidence that `better`'s mean beats `baseline`'s, from the paired per-task
    differences (normal approximation; identical differences: 1.0 above zero, 0.5 at it)."""
    differences = [b - a for b, a in zip(better, baseline, strict=True)]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return 0.5
    spread = statistics.stdev(differences)
    if spread == 0:
        return 1.0 if mean > 0 else 0.5 if mean == 0 else 0.0
    z = mean / (spread / math.sqrt(len(differences)))
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


class MetaHarness(PromptSearch):
    name = "meta_harness"
    experience = "reactive, from live traffic; every node scored on the served model"
    Settings = MetaHarnessSettings
    settings: MetaHarnessSettings

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        turns = self.scored_turns(batch)
        tasks = self.search_tasks(turns, context)
        seed = self._node(context, context.files_of(HARNESS), tasks)
        retained, written = [seed], 0
        for _ in range(self.settings.max_nodes):
            shown = retained if self.settings.mode == "full_history" else [_best(retained)]
            tree = self._write_tree(context, shown, tasks)
            if tree is None:
                continue
            written += 1
            retained.append(self._node(context, tree, tasks))
            retained = [seed, *sorted(retained[1:], key=lambda n: -n.mean)][
                : self.settings.max_candidates
            ]
            if context.progress:
                context.progress("trees", written, self.settings.max_nodes, None)
        best = _best(retained)
        sure = confidence(best.scores, seed.scores) if best is not seed else 0.0
        rests_on = f"{len(tasks)} task(s), {written} tree(s) written"
        if best is seed or sure < self.settings.min_confidence:
            raise ProposalRefused(
                f"no tree beat the current one with confidence {self.settings.min_confidence} "
                f"(best {best.mean:.2f} vs {seed.mean:.2f}, confidence {sure:.2f}, on {rests_on})"
            )
        return Proposal(
            kind="harness",
            files=best.tree,
            reason=(
                f"meta_harness ({self.settings.mode}): mean {seed.mean:.2f} -> {best.mean:.2f}, "
                f"confidence {sure:.2f} on {rests_on}"
            ),
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            metrics={
                "nodes_written": written,
                "retained": len(retained),
                "means": [n.mean for n in retained],
                "confidence": sure,
                "tasks": len(tasks),
            },
        )

    def _node(self, context: StepContext, tree: dict[str, bytes], tasks: list[SearchTask]) -> Node:
        answered = [self.answer(context, tree, task) for task in tasks]
        return Node(tree, [scored for _, scored in answered], [answer for answer, _ in answered])

    def _write_tree(
        self, context: StepContext, shown: list[Node], tasks: list[SearchTask]
    ) -> dict[str, bytes] | None:
        assert context.ask is not None
        prompt = PROPOSER_PROMPT.format(history=self._history(shown, tasks))
        reply = context.ask(
            [{"role": "user", "content": prompt}], json_schema=TREE_SCHEMA, max_tokens=1400
        )
        try:
            data = json.loads(reply)
            agents, rules = str(data["agents_md"]).strip(), str(data["rules"]).strip()
        except (ValueError, KeyError, TypeError):
            return None
        if not agents:
            return None
        tree = {"AGENTS.md": (agents[:MAX_FILE_CHARS] + "\n").encode()}
        if rules:
            tree[RULE_PATH] = (rules[:MAX_FILE_CHARS] + "\n").encode()
        return tree

    def _history(self, shown: list[Node], tasks: list[SearchTask]) -> str:
        """The designs as the proposer reads them, the best first, within `history_chars` (a
        small model's context holds about a thousand tokens): designs past it are left out."""
        ranked = sorted(enumerate(shown), key=lambda item: -item[1].mean)
        parts: list[str] = []
        for number, node in ranked:
            described = _described(number, node, tasks)
            if parts and sum(map(len, parts)) + len(described) > self.settings.history_chars:
                break
            parts.append(described[: self.settings.history_chars])
        return "\n".join(parts)


def _best(nodes: list[Node]) -> Node:
    return max(nodes, key=lambda node: node.mean)  # the earliest of a tie: the seed first


def _described(number: int, node: Node, tasks: list[SearchTask], shown_answers: int = 2) -> str:
    """One node as the proposer reads it: its files, its scores, its worst answers."""
    files = "\n".join(
        f"  --- {path}\n  {data.decode(errors='replace')[:300]}"
        for path, data in sorted(node.tree.items())
    )
    per_task = ", ".join(f"{s:g}" for s in node.scores)
    worst = sorted(range(len(node.scores)), key=lambda i: node.scores[i])[:shown_answers]
    answers = "\n".join(
        f"  - request {tasks[i].prompt[:120]!r} -> {node.answers[i][:120]!r} (score "
        f"{node.scores[i]:g}; the user said: {tasks[i].said[:160]})"
        for i in worst
    )
    files = files or "  (no files: the model as it is)"
    return f"Design {number}: mean {node.mean:.2f}; per request: {per_task}\n{files}\n{answers}\n"
