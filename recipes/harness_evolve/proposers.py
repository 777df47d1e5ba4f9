"""Proposers: reflect on failing turns and propose one harness mutation.

`HindsightProposer` shows what the user wanted as worked examples (small models follow examples
far better than rules): answers users wrote themselves, and the served model's failing answers
rewritten as the feedback asks or asked again with the feedback beside them, those that meet the
scorer (`reef.sdk.hindsight.relabel`). `RuleProposer` keeps the feedback as a
rule, for models that follow rules.
`ModelProposer` asks a model (the served one, or any OpenAI-compatible endpoint) to reflect and
answer with a JSON mutation, and is told about recent rejections so that it does not repeat them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from reef.sdk import (
    CONTENT_CHECK,
    HARNESS,
    NO_FEEDBACK_TEXT,
    Generate,
    Relabelled,
    ScorerSpec,
    StepContext,
    Turn,
    demonstrations,
    hints,
    relabel,
    sound_answers,
    wrong_fact,
)

from .mutations import EDITABLE, Mutation

PROPOSER_PROMPT = """You improve the harness of an AI assistant: its system prompt (AGENTS.md), \
rules (rules/<name>.md), skills (skills/<name>/SKILL.md) and worked examples (examples.jsonl, \
one {{"user": "...", "assistant": "..."}} per line).

Current harness files:
{files}

Calls the user scored low, with their feedback:
{failures}
{rejections}{instruction}
Propose ONE change that would make the assistant meet the feedback. Reply with only a JSON object:
{{"op": "create" or "update" or "remove", "path": "...", "content": "...", "reason": "..."}}"""


def describe_failures(turns: list[Turn], limit: int = 6) -> str:
    lines = []
    for turn in turns[:limit]:
        feedback = "; ".join(str(f) for f in turn.feedback) or "none"
        lines.append(
            f"- prompt: {turn.prompt[:300]!r}\n  answer: {turn.answer_text[:300]!r}\n"
            f"  score: {turn.score}, feedback: {feedback[:300]}"
        )
    return "\n".join(lines)


class HindsightProposer:
    """Worked examples of what the user wanted: answers the user wrote themselves (feedback
    `{"demonstration": "..."}`), and failing answers rewritten under their feedback or failing
    prompts answered again beside it, that meet `scorer` (`relabel`). The newest replace the
    oldest beyond `max_examples`."""

    def __init__(
        self,
        generate: Generate,
        scorer: ScorerSpec | None,
        max_examples: int = 4,
        samples: int = 4,
        revisions: int = 2,
        reviser: Generate | None = None,  # the model that rewrites (default: `generate`)
        content_judge: Generate | None = None,  # says whether a rewrite answers (none: words)
    ) -> None:
        self.generate = generate
        self.scorer = scorer
        self.max_examples = max_examples
        self.samples = samples
        self.revisions = revisions
        self.reviser = reviser
        self.content_judge = content_judge

    def propose(self, failures: list[Turn], context: StepContext) -> Mutation | str:
        shown_by_user = [
            (t.prompt, text.strip())
            for t in failures
            for text in sound_answers(t, demonstrations(t), context.dropped)
        ]
        hinted = [t for t in failures if hints(t) and not demonstrations(t)]
        silent = [t for t in failures if not hints(t) and not demonstrations(t)]
        context.drop(NO_FEEDBACK_TEXT, len(silent))
        if not shown_by_user and not hinted:
            if any(demonstrations(t) for t in failures):
                return "the failing turns' demonstrations say what a program finds wrong"
            return "the failing turns carry no feedback text or demonstration to act on"
        answers = relabel(
            hinted,
            self.generate,
            self.scorer,
            self.samples,
            keep=1,
            revisions=self.revisions,
            reviser=self.reviser,
            content_judge=self.content_judge,
            dropped=context.dropped,
        )
        found = shown_by_user + [(item.turn.prompt, item.answer.strip()) for item in answers]
        if not found:
            judge = "the scorer" if self.scorer is not None else "the reviser, as judge,"
            return f"no answer given under the feedback met it ({judge} said) and still answered"
        existing = context.files_of(HARNESS).get("examples.jsonl", b"").decode().splitlines()
        shown = [json.loads(line) for line in existing if line.strip()]
        # An example the tree kept from before is checked again: facts a program can check
        # are never carried on wrong (one released before this check, or written by hand).
        wrong = [e for e in shown if wrong_fact(e["user"], e["assistant"])]
        context.drop(CONTENT_CHECK, len(wrong))
        shown = [e for e in shown if e not in wrong]
        for prompt, answer in found:
            shown = [e for e in shown if e["user"] != prompt]
            shown.append({"user": prompt, "assistant": answer})
        shown = shown[-self.max_examples :]
        content = "".join(json.dumps(e) + "\n" for e in shown)
        op = "update" if "examples.jsonl" in context.files_of(HARNESS) else "create"
        return Mutation(op, "examples.jsonl", content, _examples_reason(shown_by_user, answers))


def _examples_reason(shown_by_user: list[tuple[str, str]], answers: list[Relabelled]) -> str:
    sources = []
    if shown_by_user:
        sources.append(f"{len(shown_by_user)} answer(s) the user wrote")
    if answers:
        sources.append(f"answers given with the feedback in view ({answers[0].hint[:120]!r})")
    return " and ".join(sources) + " as examples"


class RuleProposer:
    """The feedback, kept as a rule in the system prompt (for models that follow rules)."""

    def propose(self, failures: list[Turn], context: StepContext) -> Mutation | str:
        feedback = [text for turn in failures for text in hints(turn)]
        if not feedback:
            return "the failing turns carry no feedback text to act on"
        rule = "\n".join(f"- {text}" for text in dict.fromkeys(feedback)) + "\n"
        path = "rules/feedback.md"
        op = "update" if path in context.files_of(HARNESS) else "create"
        return Mutation(op, path, rule, "users' feedback, kept as a rule")


# The reply the model proposer must give: llama.cpp enforces it with a grammar, so even the
# 135M model always answers with a mutation the recipe can parse (the gate judges if it helps).
# Paths are a choice among the prose files of the tree and a new rule (a grammar cannot check a
# regex); worked examples, which must be JSON lines, are the hindsight proposer's job. One plain
# object, as OpenAI's strict schemas require at the top; `remove` only when there is a file.
NEW_RULE = "rules/feedback.md"


def mutation_schema(files: dict[str, bytes]) -> dict[str, object]:
    prose = {p for p in files if EDITABLE.match(p) and p != "examples.jsonl"}
    paths = sorted({"AGENTS.md", NEW_RULE, *prose})
    ops = ["create", "update", "remove"] if prose else ["create", "update"]
    return {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ops},
            "path": {"type": "string", "enum": paths},
            # Bounded, so that the reply closes within `reply_room`.
            "content": {"type": "string", "minLength": 1, "maxLength": 600},
            "reason": {"type": "string", "maxLength": 160},
        },
        "required": ["op", "path", "content", "reason"],
        "additionalProperties": False,
    }


def reply_room(schema: dict[str, Any]) -> int:
    """max_tokens for the longest reply `schema` allows, at a token a character (a reply cut
    short is not JSON; a step that asked for 400 lost 1 reply in 24 that way)."""
    fields = schema["properties"]
    keys = len(json.dumps(dict.fromkeys(fields, "")))
    values = sum(f.get("maxLength", max(map(len, f.get("enum", [""])))) for f in fields.values())
    return keys + values + 64  # and room for spaces the grammar allows between tokens


def fitted(mutation: Mutation, files: dict[str, bytes]) -> Mutation:
    """The model's op made to fit the tree: writing a file is `update` where it exists and
    `create` where it does not (the model cannot see which, and either means "write this")."""
    if mutation.op == "remove":
        return mutation
    op = "update" if mutation.path in files else "create"
    return dataclasses.replace(mutation, op=op)


class ModelProposer:
    """Asks a model for a mutation; `ask(messages, json_schema)` returns the reply text."""

    def __init__(self, ask: Callable[..., str]) -> None:
        self.ask = ask

    def propose(self, failures: list[Turn], context: StepContext) -> Mutation | str:
        from .mutations import MutationRefused, parse_mutation

        files = (
            "\n".join(
                f"--- {path}\n{data.decode(errors='replace')[:1500]}"
                for path, data in sorted(context.files_of(HARNESS).items())
            )
            or "(none yet)"
        )
        rejections = ""
        if context.recent_rejections:
            listed = "\n".join(f"- {r[:300]}" for r in context.recent_rejections[:5])
            rejections = f"\nRecently rejected proposals (do not repeat them):\n{listed}\n"
        instruction = (
            f"\nInstruction from the operator: {context.instruction}\n"
            if context.instruction
            else ""
        )
        prompt = PROPOSER_PROMPT.format(
            files=files,
            failures=describe_failures(failures),
            rejections=rejections,
            instruction=instruction,
        )
        schema = mutation_schema(context.files_of(HARNESS))
        messages = [{"role": "user", "content": prompt}]
        reply = self.ask(messages, json_schema=schema, max_tokens=reply_room(schema))
        try:
            return fitted(parse_mutation(reply, max_bytes=8000), context.files_of(HARNESS))
        except MutationRefused as refused:
            return str(refused)
