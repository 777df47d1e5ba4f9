"""skills: the agent's skill pool, grown by day and night (after SkillClaw, arXiv 2604.08377).

The pool is the harness tree's `skills/<name>/SKILL.md` (the format the coding agents read: a
front matter with `name` and `description`, then the skill). Its catalog, each skill's name and
description, reaches the model on every live request: the harness renders it into the system
prompt (`reef.inference.binding.compose_system_prompt`), and installs the files for the agents.

A step is a night after a day. The day is the batch's scored turns, run as tasks against the
current pool on the served model and scored by `scorer`. The night groups the day's turns by the
skill each one concerns (the skill whose name and description share the most word stems with its
request, common words aside; none: the no-skill bucket) and makes one decision per group, asked
of the proposer with the group's skill and its turns (request, the day's answer, or with
`episodes` the run's trace: the agent's steps and the test's output, its score, and what the
user said; each answer at most `answer_chars`, the cuts counted in the step's metrics): `create`
a skill, `improve` the group's skill, `merge` it into another, or `skip`. The decisions apply as
one composite change of the tree, or not at all: one that breaks a rule (a name that is taken or
not a skill name, a merge into a skill that is not there, a pool past `max_skills`) refuses the
whole night. The next day, the same tasks against the new pool, is scored in the step, and the
gate judges the candidate on the scenario's tasks and the held-out failing calls (never the
day's). With `episodes` set, the day is a suite of Harbor tasks run by the agent under the pool
(`reef.sdk.prompt_search`)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from reef.sdk import (
    HARNESS,
    Mutation,
    PromptSearch,
    PromptSearchSettings,
    Proposal,
    ProposalRefused,
    SearchTask,
    StepContext,
    Trajectory,
    TreeChangeRefused,
    apply_mutation,
    check_mutation,
)

NO_SKILL = ""  # the bucket of the turns no skill concerns
SKILL_PATH = "skills/{name}/SKILL.md"
SKILL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
WORD = re.compile(r"[a-z]{3,}")
# Words too common to say what a request is about.
COMMON = frozenset(
    {
        "about",
        "and",
        "are",
        "can",
        "could",
        "does",
        "for",
        "from",
        "have",
        "how",
        "into",
        "its",
        "not",
        "please",
        "tell",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "this",
        "those",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    }
)
SUFFIXES = ("ing", "ed", "es", "s", "e")
Decision = Literal["create", "improve", "merge", "skip"]
DECISION_SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["create", "improve", "merge", "skip"]},
        "name": {"type": "string", "maxLength": 40},
        "description": {"type": "string", "maxLength": 200},
        "body": {"type": "string", "maxLength": 800},
        "merge_into": {"type": "string", "maxLength": 40},
    },
    "required": ["decision", "name", "description", "body", "merge_into"],
    "additionalProperties": False,
}
NIGHT_PROMPT = """You keep the skills an AI assistant may use: short notes on how to do one kind \
of task well. The skills it has: {catalog}
{group}
Here is how the assistant did today on these requests (1 is what the users want), with what \
it answered:
{turns}
Decide one thing: "create" a new skill for these requests, "improve" the skill above, "merge" \
it into another skill ("merge_into"), or "skip". A skill has a short lowercase name, a one-line \
description, and a body saying what to do. Reply with only a JSON object: {{"decision": "...", \
"name": "...", "description": "...", "body": "...", "merge_into": ""}}"""


class SkillsSettings(PromptSearchSettings):
    max_skills: int = Field(12, ge=1)  # the most skills the pool may hold after a night
    turns_shown: int = Field(4, ge=1)  # of a group, in the night's question
    answer_chars: int = Field(400, ge=0)  # of each day's answer (or run's trace) the night reads


@dataclass
class Skill:
    name: str
    description: str
    body: str

    @classmethod
    def parse(cls, name: str, text: str) -> Skill:
        description, body = "", text.strip()
        front = re.match(r"---\n(.*?)\n---\n?(.*)", text, re.DOTALL)
        if front:
            body = front.group(2).strip()
            for line in front.group(1).splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "description":
                    description = value.strip()
        return cls(name, description, body)

    def render(self) -> bytes:
        front = f"---\nname: {self.name}\ndescription: {self.description}\n---\n"
        return f"{front}\n{self.body}\n".encode()

    def words(self) -> set[str]:
        return stems(f"{self.name.replace('-', ' ')} {self.description}")


@dataclass
class NightDecision:
    """One group's decision, as the proposer gave it."""

    group: str  # the skill the group concerns, or NO_SKILL
    decision: Decision
    skill: Skill
    merge_into: str = ""


@dataclass
class Night:
    decisions: list[NightDecision] = field(default_factory=list)
    answers_shown: int = 0  # the day's answers (or traces) its questions showed
    answers_cut: int = 0  # of those, cut to `answer_chars`

    def applied(self, tree: dict[str, bytes], max_skills: int) -> dict[str, bytes]:
        """The tree with every decision applied, as one change; `TreeChangeRefused` (nothing
        applied) when any decision breaks a rule."""
        changed = dict(tree)
        for decision in self.decisions:
            for mutation in _mutations(decision, changed):
                check_mutation(mutation)
                changed = apply_mutation(changed, mutation)
        if len(pool_of(changed)) > max_skills:
            raise TreeChangeRefused(
                f"the night leaves {len(pool_of(changed))} skills, over max_skills {max_skills}"
            )
        return changed


def pool_of(tree: dict[str, bytes]) -> dict[str, Skill]:
    """The tree's skills, by name."""
    found = {}
    for path, data in tree.items():
        parts = path.split("/")
        if len(parts) == 3 and parts[0] == "skills" and parts[2] == "SKILL.md":
            found[parts[1]] = Skill.parse(parts[1], data.decode(errors="replace"))
    return found


def stems(text: str) -> set[str]:
    """The words of `text` that say what it is about, each cut to a stem (`adding`, `adds` and
    `add` are one), common words left out."""
    found = set()
    for word in WORD.findall(text.lower()):
        if word in COMMON:
            continue
        for suffix in SUFFIXES:
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                word = word[: -len(suffix)]
                break
        found.add(word)
    return found


def group_of(request: str, pool: dict[str, Skill]) -> str:
    """The skill `request` concerns: the one sharing the most words with it (NO_SKILL when
    none shares any)."""
    asked = stems(request)
    overlap = {name: len(skill.words() & asked) for name, skill in pool.items()}
    best = max(sorted(overlap), key=lambda name: overlap[name], default=NO_SKILL)
    return best if best and overlap[best] > 0 else NO_SKILL


def _mutations(decision: NightDecision, tree: dict[str, bytes]) -> list[Mutation]:
    skill, why = decision.skill, f"skills: {decision.decision}"
    if decision.decision == "skip":
        return []
    if decision.decision == "create":
        if not SKILL_NAME.fullmatch(skill.name):
            raise TreeChangeRefused(f"{skill.name!r} is not a skill name (lowercase, digits, -, _)")
        return [
            Mutation("create", SKILL_PATH.format(name=skill.name), skill.render().decode(), why)
        ]
    if decision.group == NO_SKILL:
        raise TreeChangeRefused(f"{decision.decision} needs a skill, and these turns have none")
    own = SKILL_PATH.format(name=decision.group)
    if decision.decision == "improve":
        improved = Skill(decision.group, skill.description, skill.body)
        return [Mutation("update", own, improved.render().decode(), why)]
    target_path = SKILL_PATH.format(name=decision.merge_into)
    if target_path not in tree or decision.merge_into == decision.group:
        raise TreeChangeRefused(f"merge into {decision.merge_into!r}: no such other skill")
    target = Skill.parse(decision.merge_into, tree[target_path].decode(errors="replace"))
    merged = Skill(target.name, target.description, f"{target.body}\n\n{skill.body}".strip())
    return [
        Mutation("update", target_path, merged.render().decode(), why),
        Mutation("remove", own, "", why),
    ]


def _subject(decision: NightDecision) -> str:
    return decision.skill.name if decision.decision == "create" else decision.group


class Skills(PromptSearch):
    name = "skills"
    experience = "reactive, from live traffic; the day's tasks scored on the served model"
    Settings = SkillsSettings
    settings: SkillsSettings

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        turns = self.scored_turns(batch)
        tasks = self.search_tasks(turns, context)
        tree = context.files_of(HARNESS)
        day = self._day(context, tree, tasks)
        night = self._night(context, tree, tasks, day)
        scores = [scored for _, scored in day]
        acting = [d for d in night.decisions if d.decision != "skip"]
        if not acting:
            raise ProposalRefused(f"every group's decision was skip ({len(night.decisions)})")
        try:
            grown = night.applied(tree, self.settings.max_skills)
        except TreeChangeRefused as refused:
            raise ProposalRefused(
                f"the night is refused, nothing applied: {refused.message}"
            ) from None
        next_day = [scored for _, scored in self._day(context, grown, tasks)]
        said = ", ".join(f"{d.decision} {_subject(d)}" for d in acting)
        before, after = statistics.fmean(scores), statistics.fmean(next_day)
        return Proposal(
            kind="harness",
            files=grown,
            reason=f"skills: {said}; the day's tasks {before:.2f} -> {after:.2f}",
            consumed_record_ids=[r for t in batch for r in t.record_ids],
            metrics={
                "decisions": [d.decision for d in night.decisions],
                "pool_before": len(pool_of(tree)),
                "pool_after": len(pool_of(grown)),
                "day_mean": before,
                "next_day_mean": after,
                "tasks": len(tasks),
                # What the night read of the day: the answers it showed, and those it cut.
                "night_answers": night.answers_shown,
                "night_answers_cut": night.answers_cut,
            },
        )

    def _day(
        self, context: StepContext, tree: dict[str, bytes], tasks: list[SearchTask]
    ) -> list[tuple[str, float]]:
        """Each task's answer under `tree` (with `episodes`, its runs' traces) and score."""
        return [self.answer(context, tree, task) for task in tasks]

    def _night(
        self,
        context: StepContext,
        tree: dict[str, bytes],
        tasks: list[SearchTask],
        day: list[tuple[str, float]],
    ) -> Night:
        pool = pool_of(tree)
        groups: dict[str, list[tuple[SearchTask, str, float]]] = {}
        for task, (answer, scored) in zip(tasks, day, strict=True):
            groups.setdefault(group_of(task.prompt, pool), []).append((task, answer, scored))
        night = Night()
        for group, members in sorted(groups.items()):
            decision = self._decide(context, pool, group, members, night)
            if decision is not None:
                night.decisions.append(decision)
        return night

    def _shown(self, answer: str, night: Night) -> str:
        """A day's answer as the night reads it: whole, or cut to `answer_chars` and counted."""
        limit = self.settings.answer_chars
        if len(answer) <= limit:
            return answer
        night.answers_cut += 1
        return answer[:limit] + "…"

    def _decide(
        self,
        context: StepContext,
        pool: dict[str, Skill],
        group: str,
        members: list[tuple[SearchTask, str, float]],
        night: Night,
    ) -> NightDecision | None:
        assert context.ask is not None
        catalog = ", ".join(f"{s.name} ({s.description})" for s in pool.values()) or "none yet"
        shown = pool.get(group)
        about = (
            f"These requests concern the skill {shown.name}: {shown.description}\n{shown.body}"
            if shown
            else "No skill concerns these requests."
        )
        shown_members = members[: self.settings.turns_shown]
        lines = "\n".join(
            f"- {task.prompt[:160]!r} -> score {scored:g}; it answered: "
            f"{self._shown(answer, night)!r}; the user said: {task.said[:160]}"
            for task, answer, scored in shown_members
        )
        prompt = NIGHT_PROMPT.format(catalog=catalog, group=about, turns=lines)
        night.answers_shown += len(shown_members)
        reply = context.ask(
            [{"role": "user", "content": prompt}], json_schema=DECISION_SCHEMA, max_tokens=600
        )
        try:
            data = json.loads(reply)
            skill = Skill(
                str(data["name"]).strip().lower(),
                " ".join(str(data["description"]).split()),
                str(data["body"]).strip(),
            )
            return NightDecision(group, data["decision"], skill, str(data["merge_into"]).strip())
        except (ValueError, KeyError, TypeError):
            return None  # an answer that is not a decision: this group skips
