"""self_play: a designer proposes tasks a program checks, rewarded for the edge of the agent's
ability; the agent learns from its attempts (after upstream Reef's self-play recipe, SPADE).

A round: the designer (the proposer model) proposes `tasks_per_round` tasks of the configured
`kinds`, each a kind and its parameters; the program of its kind (`tasks.py`) computes the
expected answer and checks every answer, so no designed task is wrong about itself. The agent
(the served model, under the current tree) attempts each task `attempts` times, sampled. A
task's solve rate p gives the designer its reward, the regret 4 p (1 - p): 1 for a task solved
half the time, 0 for one always or never solved. The designer reads its past tasks with their
solve rates, the most rewarded first, when it designs the next round.

The agent learns from the attempts at the edge (0 < p < 1): one solving answer of each such task
becomes a worked example of the tree (`examples.jsonl`, the newest `examples_kept` kept). The
gate judges the candidate on a fresh round of the designer's tasks, scored by their programs,
never on a task whose answer the tree now shows. A round that finds no task at the edge proposes
nothing. Rounds need no traffic: the worker asks every interval, and a round runs at
most every `every_s` seconds.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from reef.recipes.self_play.tasks import KINDS, NotATask, Task, task_of
from reef.sdk import (
    HARNESS,
    EvalTask,
    ExperienceView,
    Proposal,
    ProposalRefused,
    Recipe,
    RecipeError,
    RecipeSettings,
    StepContext,
    Trajectory,
    answer_text,
    wrong_fact,
)

EXAMPLES = "examples.jsonl"
DESIGN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": list(KINDS)},
                    "a": {"type": "integer"},
                    "op": {"enum": ["+", "-", "*"]},
                    "b": {"type": "integer"},
                    "text": {"type": "string", "pattern": "^[a-z]{1,16}$"},
                    "letter": {"type": "string", "pattern": "^[a-z]$"},
                },
                # Every parameter, whatever the kind (a kind ignores the others): a designer
                # constrained by this schema always names what its kind needs.
                "required": ["kind", "a", "op", "b", "text", "letter"],
            },
        }
    },
    "required": ["tasks"],
}
DESIGN_PROMPT = """You design practice tasks for an AI assistant. The kinds: {kinds}. \
Parameters: arithmetic has integers "a" and "b" and "op" (+, -, *); reverse and uppercase have a \
lowercase word "text"; count has "text" and one "letter". The best tasks are the ones the \
assistant solves sometimes, not always and not never. Your past tasks, with how often it solved \
them (the most useful first):
{history}
Design {count} new tasks. Reply with only a JSON object: {{"tasks": [{{"kind": "...", ...}}]}}"""


class SelfPlaySettings(RecipeSettings):
    kinds: list[Literal["arithmetic", "reverse", "uppercase", "count"]] = Field(
        default_factory=lambda: list(KINDS)
    )
    tasks_per_round: int = Field(6, ge=1)
    attempts: int = Field(4, ge=2)  # per task: a solve rate needs a few
    temperature: float = Field(0.8, gt=0, le=2)  # the attempts are sampled
    max_tokens: int = Field(24, ge=1)
    examples_kept: int = Field(4, ge=1)  # worked examples the tree keeps, the newest
    every_s: float = Field(600.0, ge=0)  # at most one round this often
    history_shown: int = Field(8, ge=0)  # past tasks the designer reads
    seed: int = 0


def regret(solve_rate: float) -> float:
    """The designer's reward for a task the agent solves at `solve_rate`: 1 at one half, 0 at
    never or always."""
    return 4 * solve_rate * (1 - solve_rate)


@dataclass
class Attempted:
    task: Task
    solved: list[str]  # the answers that solved it
    tries: int

    @property
    def solve_rate(self) -> float:
        return len(self.solved) / self.tries


@dataclass
class Designer:
    """What the designer remembers: its past tasks and their solve rates."""

    past: list[tuple[str, float]] = field(default_factory=list)

    def shown(self, count: int) -> str:
        ranked = sorted(self.past, key=lambda item: -regret(item[1]))[:count]
        lines = [f"- {prompt} solved {rate:.0%} of the time" for prompt, rate in ranked]
        return "\n".join(lines) or "(none yet)"


class SelfPlay(Recipe):
    name = "self_play"
    signal = "a program's check of the agent's answers to designed tasks"
    experience = "self-generated: tasks a designer proposes at the edge of the agent's ability"
    target = "harness"
    Settings = SelfPlaySettings
    settings: SelfPlaySettings
    waits_for_traffic = False

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self.designer = Designer()
        self._last_round = float("-inf")

    def ready(self, view: ExperienceView) -> bool:
        return time.monotonic() - self._last_round >= self.settings.every_s

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return []  # its experience is its own attempts: it consumes no records

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        if context.ask is None or context.generate is None:
            raise RecipeError(
                "self_play needs a proposer and the served model: the worker gives both"
            )
        self._last_round = time.monotonic()
        designed, refused = self.design(context)
        attempted = [self.attempt(context, task) for task in designed]
        self.designer.past += [(a.task.prompt, a.solve_rate) for a in attempted]
        edge = [a for a in attempted if 0 < a.solve_rate < 1]
        rates = [round(a.solve_rate, 2) for a in attempted]
        reward = statistics.fmean(regret(a.solve_rate) for a in attempted) if attempted else 0.0
        metrics = {
            "designed": len(designed) + refused,
            "checkable": len(designed),
            "solve_rates": rates,
            "designer_reward": reward,
            "edge_tasks": len(edge),
        }
        if not edge:
            raise ProposalRefused(
                f"no designed task at the edge of the agent's ability (solve rates {rates}, "
                f"{refused} not checkable)"
            )
        tree = context.files_of(HARNESS)
        examples = [{"user": a.task.prompt, "assistant": a.solved[0]} for a in edge]
        kept = _examples(tree, examples, self.settings.examples_kept)
        judged = self.fresh_tasks(context, {*_users(kept), *(t.prompt for t in designed)})
        metrics["gate_tasks"] = len(judged)
        if not judged:
            raise ProposalRefused(
                "no fresh task for the gate: the designer's second round repeated this round's "
                "tasks (or the examples'), and a candidate judged on the eval files alone would "
                "not be judged on what it learned; the examples wait for the next round"
            )
        return Proposal(
            kind="harness",
            files={**tree, EXAMPLES: kept},
            reason=(
                f"self_play: {len(edge)} of {len(designed)} designed task(s) at the edge "
                f"(designer reward {reward:.2f}); their solving answers as worked examples"
            ),
            consumed_record_ids=[],
            eval_tasks=[_eval_task(number, task) for number, task in enumerate(judged)],
            metrics=metrics,
        )

    def fresh_tasks(self, context: StepContext, seen: set[str]) -> list[Task]:
        """Tasks the gate judges the candidate on: a fresh round from the same designer, none
        of them a task of this round or one whose answer the tree shows (the candidate would
        pass it by reading its own worked example)."""
        designed, _ = self.design(context)
        fresh = {task.prompt: task for task in designed if task.prompt not in seen}
        return list(fresh.values())

    def design(self, context: StepContext) -> tuple[list[Task], int]:
        """The round's tasks, and how many the designer proposed that no program checks."""
        assert context.ask is not None
        prompt = DESIGN_PROMPT.format(
            kinds=", ".join(self.settings.kinds),
            history=self.designer.shown(self.settings.history_shown),
            count=self.settings.tasks_per_round,
        )
        count = self.settings.tasks_per_round
        schema = copy.deepcopy(DESIGN_SCHEMA)
        schema["properties"]["tasks"].update(minItems=count, maxItems=count)
        reply = context.ask(
            [{"role": "user", "content": prompt}], json_schema=schema, max_tokens=120 * count
        )
        try:
            specs = json.loads(reply)["tasks"]
        except (ValueError, KeyError, TypeError):
            raise ProposalRefused(
                f"the designer's reply is not a task list: {reply[:120]!r}"
            ) from None
        tasks, refused = [], 0
        for spec in specs[: self.settings.tasks_per_round]:
            try:
                task = task_of(spec) if isinstance(spec, dict) else None
            except NotATask:
                task = None
            if task is None or task.kind not in self.settings.kinds:
                refused += 1
            else:
                tasks.append(task)
        return tasks, refused

    def attempt(self, context: StepContext, task: Task) -> Attempted:
        """The agent's sampled attempts at `task` under the current tree, checked."""
        assert context.generate is not None
        solved = []
        for number in range(self.settings.attempts):
            body: dict[str, Any] = {
                "messages": [{"role": "user", "content": task.prompt}],
                "temperature": self.settings.temperature,
                "seed": self.settings.seed + number,
                "max_tokens": self.settings.max_tokens,
            }
            answer = answer_text(context.generate(body))
            # Solved in full: the right result, and no wrong step on the way to it ("12 - 5 =
            # 8, so the answer is 7" has the right last number, and would teach the wrong sum).
            if task.solved_by(answer) and wrong_fact(task.prompt, answer) is None:
                solved.append(answer.strip())
        return Attempted(task, solved, self.settings.attempts)


def _examples(tree: dict[str, bytes], new: list[dict[str, str]], kept: int) -> bytes:
    """The tree's worked examples with `new` after them, the newest `kept`, one per request."""
    lines = tree.get(EXAMPLES, b"").decode().splitlines()
    old = [json.loads(line) for line in lines if line.strip()]
    by_user: dict[str, dict[str, str]] = {}
    for example in [*old, *new]:  # a request answered again moves to the newest place
        by_user.pop(example["user"], None)
        by_user[example["user"]] = example
    return "".join(json.dumps(e) + "\n" for e in list(by_user.values())[-kept:]).encode()


def _users(examples: bytes) -> list[str]:
    """The requests a worked-examples file answers."""
    return [json.loads(line)["user"] for line in examples.decode().splitlines() if line.strip()]


def _eval_task(number: int, task: Task) -> EvalTask:
    return EvalTask(
        id=f"self_play:{number}",
        messages=[{"role": "user", "content": task.prompt}],
        scorer={"type": "regex", "pattern": task.pattern},
    )
