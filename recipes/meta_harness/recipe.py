"""meta_harness: a search over whole harness trees, the proposer reading the full history.

A step turns the batch's scored turns into tasks (as `gepa` does: each prompt, scored by
`scorer`, with the user's feedback on it) and grows a history of trees, each scored on every
task. Each new node is a complete tree the proposer model writes (its `AGENTS.md` and a rule
file) after reading the history: in `full_history` mode every node written in the step (its
files, its mean, its score on each task, and the raw answers or episode traces of its failures,
with what was said about them) and the scenario's earlier candidates (their files and gate
scores: the history kept across steps in the candidate store), in `incumbent_only` mode the best
node alone. The history is what fits the proposer's context (`history_chars`, by default what the
served model's context window leaves): every design is named with its scores, then the designs'
files and failures are given whole, the most informative first (the best, then the worst, then
the rest by mean), and what did not fit is said. At most `max_candidates` nodes are retained for
the proposal (the best by mean, the seed always), and at most `max_nodes` are written in a step.

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
    Evaluated,
    PromptSearch,
    PromptSearchSettings,
    Proposal,
    ProposalRefused,
    SearchTask,
    StepContext,
    Trajectory,
    files_of,
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
    # The longest history the proposer is shown, in characters; None: what the proposer's
    # context window leaves (`StepContext.proposer_context_tokens`, at 3 characters a token,
    # after its reply). Every design is named; what does not fit of their files and failures
    # is left out, the most informative kept, and said.
    history_chars: int | None = Field(None, ge=200)
    earlier_shown: int = Field(8, ge=0)  # the scenario's earlier candidates in the history


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
        retained, written, tried = [seed], 0, [seed]
        for _ in range(self.settings.max_nodes):
            full = self.settings.mode == "full_history"
            shown = tried if full else [_best(retained)]
            tree = self._write_tree(context, shown, tasks, context.evaluated if full else [])
            if tree is None:
                continue
            written += 1
            node = self._node(context, tree, tasks)
            tried.append(node)
            retained.append(node)
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
                "history_chars": self._history_chars(context),  # said: a small window shows less
            },
        )

    def _history_chars(self, context: StepContext) -> int:
        """What of the search the proposer reads, in characters: set, or what its context
        window leaves after its reply."""
        return self.settings.history_chars or history_budget(context.proposer_context_tokens)

    def _node(self, context: StepContext, tree: dict[str, bytes], tasks: list[SearchTask]) -> Node:
        answered = [self.answer(context, tree, task) for task in tasks]
        return Node(tree, [scored for _, scored in answered], [answer for answer, _ in answered])

    def _write_tree(
        self,
        context: StepContext,
        shown: list[Node],
        tasks: list[SearchTask],
        earlier: list[Evaluated],
    ) -> dict[str, bytes] | None:
        assert context.ask is not None
        budget = self._history_chars(context)
        history = search_history(shown, tasks, earlier[: self.settings.earlier_shown], budget)
        prompt = PROPOSER_PROMPT.format(history=history)
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
        return designed(context.files_of(HARNESS), agents, rules)



def designed(serving: dict[str, bytes], agents: str, rules: str) -> dict[str, bytes]:
    """The serving tree with a design's two files written over it: its other files (worked
    examples, skills, the house's rules) are carried, since a harness release replaces the
    whole tree and a design that names only AGENTS.md would drop them (issue 76). A design
    without rules removes the rules file of its own, its one deliberate deletion."""
    tree = {path: data for path, data in serving.items() if path != RULE_PATH}
    tree["AGENTS.md"] = (agents[:MAX_FILE_CHARS] + "\n").encode()
    if rules:
        tree[RULE_PATH] = (rules[:MAX_FILE_CHARS] + "\n").encode()
    return tree


def _best(nodes: list[Node]) -> Node:
    return max(nodes, key=lambda node: node.mean)  # the earliest of a tie: the seed first


# What the proposer's reply and the prompt's own words take of its context, in tokens.
REPLY_TOKENS = 1400 + 300
CHARS_PER_TOKEN = 3  # a cautious count: code and JSON are denser than prose
REMOTE_CONTEXT_TOKENS = 16_384  # a proposer at `learning.proposer_url`, its window unknown


def history_budget(context_tokens: int | None) -> int:
    """The characters of history that fit the proposer's context window after its reply."""
    tokens = context_tokens if context_tokens is not None else REMOTE_CONTEXT_TOKENS
    return max(200, (tokens - REPLY_TOKENS) * CHARS_PER_TOKEN)


def search_history(
    shown: list[Node], tasks: list[SearchTask], earlier: list[Evaluated], budget: int
) -> str:
    """The search so far as the proposer reads it, within `budget` characters: first every
    design named with its mean and its score on each request (this step's, then the scenario's
    earlier candidates with their gate scores), then each design's files and failures whole,
    the most informative first (the best, the worst, then the rest by mean), as many as fit;
    a last line says whose details were left out."""
    ranked = sorted(range(len(shown)), key=lambda i: -shown[i].mean)
    order = ranked[:1] + ranked[-1:] + ranked[1:-1] if len(ranked) > 1 else ranked
    names = [_named(number, shown[number]) for number in range(len(shown))]
    names += [_earlier_named(number, found) for number, found in enumerate(earlier)]
    parts, used = ["\n".join(names)], len("\n".join(names))
    left_out = []
    details = [(f"Design {n}", _details(n, shown[n], tasks)) for n in order]
    details += [(f"Earlier {n}", _earlier_details(n, e)) for n, e in enumerate(earlier)]
    for name, detail in details:
        if used + len(detail) > budget:
            left_out.append(name)
            continue
        parts.append(detail)
        used += len(detail)
    if left_out:
        parts.append(f"(left out for room, scores above only: {', '.join(left_out)})")
    return "\n".join(parts)


def _named(number: int, node: Node) -> str:
    per_task = ", ".join(f"{s:g}" for s in node.scores)
    return f"Design {number}: mean {node.mean:.2f}; per request: {per_task}"


def _details(number: int, node: Node, tasks: list[SearchTask]) -> str:
    """A design's files whole, and each of its failures: the request, the raw answer (or
    episode trace) and what was said about it."""
    files = "\n".join(
        f"  --- {path}\n{data.decode(errors='replace')}" for path, data in sorted(node.tree.items())
    )
    failures = "\n".join(
        f"  - request {tasks[i].prompt!r} -> {node.answers[i]!r} (score {node.scores[i]:g}; "
        f"the user said: {tasks[i].said})"
        for i in range(len(node.scores))
        if node.scores[i] < 1.0
    )
    return (
        f"Design {number}, its files:\n{files or '  (no files: the model as it is)'}\n"
        f"Its failures:\n{failures or '  (none)'}\n"
    )


def _earlier_named(number: int, found: Evaluated) -> str:
    scores = list(found.scores.values())
    mean = statistics.fmean(scores) if scores else 0.0
    return f"Earlier {number} ({found.candidate_id}): gate mean {mean:.2f} on {len(scores)} task(s)"


def _earlier_details(number: int, found: Evaluated) -> str:
    files = "\n".join(
        f"  --- {path}\n{data.decode(errors='replace')}"
        for path, data in sorted(files_of(found.files, HARNESS).items())
    )
    lost = ", ".join(task for task, scored in found.scores.items() if scored < 1.0) or "none"
    return f"Earlier {number}, its files:\n{files or '  (none)'}\nIts gate's failures: {lost}\n"
