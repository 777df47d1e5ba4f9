"""Prompts the speed benchmarks share: an agent's conversation, fixed text that no commit
changes, so that runs of different commits read the same tokens."""

from __future__ import annotations

# Thousands of one-letter words: a prompt of any length whose tokens no chat template merges.
WORDS = ("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 800).split()


def conversation(agent: str) -> list[dict[str, str]]:
    """About 2,000 tokens: a long system prompt of tool rules, and a long task description."""
    rules = " ".join(
        f"Rule {n}: when you change the file src/module_{n}.py, keep each function short and "
        f"run the tests of module {n} before you answer."
        for n in range(1, 41)
    )
    task = " ".join(
        f"Step {n}: {agent} reads the log line {n * 7} and notes which service wrote it."
        for n in range(1, 46)
    )
    return [
        {"role": "system", "content": f"You are coding agent {agent}. {rules}"},
        {"role": "user", "content": task},
    ]
