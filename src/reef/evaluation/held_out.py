"""Held out: a share of the failing calls is never learned from, so the gate judges on it.

A recipe that searches, trains on, or shows as an example the very prompts the gate then scores
it on passes its gate by remembering them: its gate cannot see that it learned nothing that
carries to the next user. So a share of a scenario's failing trajectories (`gate.held_out`: a
call or a session with a turn users scored below `gate.replay_threshold`) is kept out of every
recipe's experience, whole, chosen by the words of the prompt it opens with and the gate's seed:
every process and every step agrees, and a prompt asked twice is held out both times, never
learned from once and judged on the other. Their failing turns become the gate's `feedback`
tasks for the recipes that have a scorer to judge them (`reef.sdk.recipe.Recipe.held_out_tasks`).
Good answers are held back apart, for the gate's replay (`reef.evaluation.replay`). The gate
never asks a candidate a prompt its worked examples answer and the current release's do not
(`shown_prompts`): such a candidate is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from reef.evaluation.tasks import EvalTask
from reef.protocol import message_text

HELD_OUT_PREFIX = "held-out:"  # the id of a gate task made from a held-out call


def held_out(prompt: str, share: float, seed: int = 0) -> bool:
    """Whether a failing call asking `prompt` is kept from learning, for the gate (`share` of
    the prompts: 0 keeps none)."""
    if share <= 0:
        return False
    digest = hashlib.sha256(f"held-out:{seed}:{prompt_key(prompt)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def prompt_key(text: str) -> str:
    """A prompt as the leak check compares it: its words, lower-cased."""
    return " ".join(text.lower().split())


def task_prompt(task: EvalTask) -> str:
    """The last user message of a chat task: what it asks."""
    for message in reversed(task.messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def shown_prompts(examples: Iterable[tuple[str, str]]) -> set[str]:
    """The prompts (`prompt_key`) worked examples, (user, assistant) pairs, answer."""
    return {prompt_key(user) for user, _ in examples}


def leaked(tasks: list[EvalTask], shown: set[str]) -> list[EvalTask]:
    """The tasks whose prompt the examples `shown` answer."""
    return [task for task in tasks if shown and prompt_key(task_prompt(task)) in shown]
