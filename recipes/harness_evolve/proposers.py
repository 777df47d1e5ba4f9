"""Proposers: reflect on failing turns and propose one harness mutation.

`RuleProposer` is deterministic: it turns feedback into worked examples or a rule. `ModelProposer`
asks a model (the served one, or any OpenAI-compatible endpoint) to reflect and answer with a JSON
mutation, and is told about recent rejections so that it does not repeat them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from recipes.harness_evolve.mutations import Mutation

from reef.learning.experience import Turn
from reef.learning.recipe import StepContext

# "end every answer with the line: Cheers, Reef" and close variants.
SIGN_OFF = re.compile(
    r"end (?:every|each|all|your)?\s*(?:answers?|replies|reply|responses?)?\s*with"
    r"(?: the line| the words| the phrase)?\s*[:\-]?\s*[\"'“]?(?P<line>[^\"'”\n]+?)[\"'”]?\s*\.?$",
    re.IGNORECASE,
)
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


class RuleProposer:
    """Feedback that asks for a sign-off becomes worked examples; other feedback becomes a rule."""

    def __init__(self, max_examples: int = 4) -> None:
        self.max_examples = max_examples

    def propose(self, failures: list[Turn], context: StepContext) -> Mutation | str:
        feedback = [str(f).strip() for turn in failures for f in turn.feedback if str(f).strip()]
        if not feedback:
            return "the failing turns carry no feedback text to act on"
        for text in feedback:
            match = SIGN_OFF.search(text)
            if match:
                return self._examples(failures, context, match.group("line").strip())
        rule = "\n".join(f"- {text}" for text in dict.fromkeys(feedback)) + "\n"
        path = "rules/feedback.md"
        op = "update" if path in context.files else "create"
        return Mutation(op, path, rule, "users' feedback, kept as a rule")

    def _examples(self, failures: list[Turn], context: StepContext, line: str) -> Mutation:
        existing = context.files.get("examples.jsonl", b"").decode().splitlines()
        shown = [json.loads(e) for e in existing if e.strip()]
        for turn in failures:
            first_sentence = re.split(r"(?<=[.!?])\s", turn.answer_text.strip(), maxsplit=1)[0]
            answer = (first_sentence[:160] or "Here you are.") + f"\n{line}"
            if turn.prompt and all(e["user"] != turn.prompt for e in shown):
                shown.append({"user": turn.prompt, "assistant": answer})
        shown = shown[-self.max_examples :]  # the newest failures replace the oldest examples
        content = "".join(json.dumps(e) + "\n" for e in shown)
        op = "update" if "examples.jsonl" in context.files else "create"
        return Mutation(
            op,
            "examples.jsonl",
            content,
            f"feedback asks every answer to end with {line!r}: shown in worked examples",
        )


class ModelProposer:
    """Asks a model for a mutation; `ask` sends chat messages and returns the reply text."""

    def __init__(self, ask: Callable[[list[dict[str, str]]], str]) -> None:
        self.ask = ask

    def propose(self, failures: list[Turn], context: StepContext) -> Mutation | str:
        from recipes.harness_evolve.mutations import MutationRefused, parse_mutation

        files = (
            "\n".join(
                f"--- {path}\n{data.decode(errors='replace')[:1500]}"
                for path, data in sorted(context.files.items())
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
        reply = self.ask([{"role": "user", "content": prompt}])
        try:
            return parse_mutation(reply, max_bytes=8000)
        except MutationRefused as refused:
            return str(refused)
