"""The kinds of task self_play designs, each with the program that checks an answer.

A designer names a kind and its parameters (`{"kind": "arithmetic", "a": 37, "op": "*", "b":
12}`); the program here, not the designer, computes the expected answer, so a designed task is
never wrong about its own answer. Parameters outside a kind's bounds are refused.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("arithmetic", "reverse", "uppercase", "count")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
WORD = re.compile(r"[a-z]{1,16}")
LIMIT = 100_000  # |a| and |b| of an arithmetic task


class NotATask(ValueError):
    """A designer's task that no program here can check."""


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str
    expected: str

    def solved_by(self, answer: str) -> bool:
        """The checking program: the expected answer, as the answer's last number (arithmetic
        and count: `1 + 2 = 3` says 3) or as a word of it (reverse, uppercase), case-sensitive
        for uppercase."""
        if self.kind in ("arithmetic", "count"):
            numbers = re.findall(r"-?\d+", answer.replace(",", ""))
            return bool(numbers) and numbers[-1] == self.expected
        words = re.findall(r"[A-Za-z]+", answer)
        if self.kind == "uppercase":
            return self.expected in words
        return self.expected in (word.lower() for word in words)

    @property
    def pattern(self) -> str:
        """A regex the gate's scorer matches a solving answer with (a number: the last one)."""
        escaped = re.escape(self.expected)
        if self.kind in ("arithmetic", "count"):
            return rf"(?s)(?<![\d-]){escaped}(?!\d)(?!.*\d)"
        return escaped


def task_of(spec: dict[str, Any]) -> Task:
    """The task a designer's spec describes, or `NotATask` saying why."""
    kind = spec.get("kind")
    if kind == "arithmetic":
        a, b, op = spec.get("a"), spec.get("b"), spec.get("op")
        if not (isinstance(a, int) and isinstance(b, int) and op in OPS):
            raise NotATask("arithmetic needs integers a and b and an op of + - *")
        if max(abs(a), abs(b)) > LIMIT:
            raise NotATask(f"arithmetic numbers are at most {LIMIT} in size")
        prompt = f"What is {a} {op} {b}? Answer with the number only."
        return Task(kind, prompt, str(OPS[op](a, b)))
    text = str(spec.get("text", "")).lower()
    if kind in ("reverse", "uppercase", "count") and not WORD.fullmatch(text):
        raise NotATask(f"{kind} needs a word of 1 to 16 letters")
    if kind == "reverse":
        return Task(kind, f"Write the word {text} backwards. Answer with one word.", text[::-1])
    if kind == "uppercase":
        return Task(kind, f"Write the word {text} in capital letters.", text.upper())
    if kind == "count":
        letter = str(spec.get("letter", "")).lower()
        if not re.fullmatch(r"[a-z]", letter):
            raise NotATask("count needs one letter")
        prompt = (
            f"How many times does the letter {letter} appear in the word {text}? "
            "Answer with the number only."
        )
        return Task(kind, prompt, str(text.count(letter)))
    raise NotATask(f"no kind {kind!r}: one of {', '.join(KINDS)}")


def held_out(kinds: tuple[str, ...], count: int, seed: int) -> list[Task]:
    """`count` tasks of `kinds` drawn by a seeded program, none designed: the same kinds of task,
    to measure the agent on before and after."""
    draw = random.Random(seed)
    words = ["apple", "river", "stone", "cloud", "garden", "pencil", "window", "tiger"]
    tasks = []
    for number in range(count):
        kind = kinds[number % len(kinds)]
        spec: dict[str, Any] = {"kind": kind, "text": draw.choice(words)}
        if kind == "arithmetic":
            spec = {"kind": kind, "a": draw.randint(2, 60), "op": draw.choice("+-*"),
                    "b": draw.randint(2, 60)}  # fmt: skip
        if kind == "count":
            spec["letter"] = draw.choice(spec["text"])
        tasks.append(task_of(spec))
    return tasks
