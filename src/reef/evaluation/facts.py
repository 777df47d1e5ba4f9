"""Facts a program can check in an answer, so that learning a form never teaches a wrong one.

Hindsight turns the model's own answer into the answer it should have given when the feedback
was about form ("end with the line: Cheers"): "10 minus 4 = 2\n\nCheers" meets the feedback and
keeps what the first answer said, and is wrong. What a program can verify it checks here, with
no model: arithmetic. `wrong_fact(question, answer)` says what is wrong, or None when nothing
checkable is:

- every statement of the form `a op b = c` (or "is", "equals", "makes"; op one of + - * / x,
  plus, minus, times, multiplied by, divided by) in the answer must hold;
- an answer to an arithmetic question, written with its sign or in words ("What is 10 minus
  4?", "Subtract 4 from 10."), that states numbers must state the result (a number word from
  zero to twenty counts).

Anything else (which element a metal is) no program here can check: a learner's examples are
held to the gate's correctness tasks with them in context instead (`docs/recipes.md`).
"""

from __future__ import annotations

import re

_NUMBER = r"-?\d+(?:\.\d+)?"
_OPERATORS = {
    "+": "+",
    "plus": "+",
    "-": "-",
    "\u2212": "-",
    "minus": "-",
    "*": "*",
    "x": "*",
    "\u00d7": "*",
    "times": "*",
    "multiplied by": "*",
    "/": "/",
    "\u00f7": "/",
    "divided by": "/",
}
_OPERATOR = "|".join(
    re.escape(op) if not op.isalpha() and " " not in op else rf"\b{op}\b"
    for op in sorted(_OPERATORS, key=len, reverse=True)
)
_EXPRESSION = rf"({_NUMBER})\s*({_OPERATOR})\s*({_NUMBER})"
_CLAIM = re.compile(rf"{_EXPRESSION}\s*(?:=|\bis\b|\bequals\b|\bmakes\b|\bgives\b)\s*({_NUMBER})")
_QUESTION = re.compile(_EXPRESSION, re.IGNORECASE)
_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_STATED = re.compile(rf"{_NUMBER}|\b(?:{'|'.join(_WORDS)})\b", re.IGNORECASE)


def computed(left: str, operator: str, right: str) -> float | None:
    """`left operator right`, or None for a division by zero."""
    a, b, op = float(left), float(right), _OPERATORS[operator.lower()]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b else None


def _said(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def wrong_claims(answer: str) -> list[str]:
    """The arithmetic statements of `answer` that do not hold, each with its right result."""
    wrong = []
    for match in _CLAIM.finditer(answer.replace(",", "")):
        left, operator, right, stated = match.groups()
        value = computed(left, operator, right)
        if value is not None and abs(value - float(stated)) > 1e-9:
            wrong.append(f"{match.group(0).strip()} (it is {_said(value)})")
    return wrong


# An operation asked in words rather than with its sign, with the order its operands take:
# "add 5 and 6", "the sum of 5 and 6"; "subtract 4 from 10" (the other way round); "the
# difference between 4 and 10" (the larger first: a difference is said as 6, not -6);
# "multiply 3 by 4"; "divide 12 by 3".
_AS_WRITTEN, _REVERSED, _LARGER_FIRST = "as written", "reversed", "larger first"
_WORDED = [
    (
        re.compile(rf"\b(?:add|sum of)\s+({_NUMBER})\s+(?:and|to|plus)\s+({_NUMBER})", re.I),
        "+",
        _AS_WRITTEN,
    ),
    (re.compile(rf"\bsubtract\s+({_NUMBER})\s+from\s+({_NUMBER})", re.I), "-", _REVERSED),
    (
        re.compile(rf"\bdifference between\s+({_NUMBER})\s+and\s+({_NUMBER})", re.I),
        "-",
        _LARGER_FIRST,
    ),
    (
        re.compile(rf"\b(?:multiply|product of)\s+({_NUMBER})\s+(?:and|by)\s+({_NUMBER})", re.I),
        "*",
        _AS_WRITTEN,
    ),
    (re.compile(rf"\bdivide\s+({_NUMBER})\s+by\s+({_NUMBER})", re.I), "/", _AS_WRITTEN),
]


def _ordered(left: str, right: str, order: str) -> tuple[str, str]:
    if order == _REVERSED or (order == _LARGER_FIRST and float(right) > float(left)):
        return right, left
    return left, right


def expected_result(question: str) -> float | None:
    """The result an arithmetic question asks for ("What is 10 minus 4?", "Subtract 4 from 10."
    -> 6), or None for a question that is not one operation."""
    text = question.replace(",", "")
    found = [tuple(match) for match in _QUESTION.findall(text)]
    for pattern, operator, order in _WORDED:
        for left, right in pattern.findall(text):
            first, second = _ordered(left, right, order)
            found.append((first, operator, second))
    if len(found) != 1:
        return None
    left, operator, right = found[0]
    return computed(left, operator, right)


def stated_numbers(answer: str) -> set[float]:
    numbers = set()
    for token in _STATED.findall(answer.replace(",", "")):
        word = token.lower()
        numbers.add(float(_WORDS.index(word)) if word in _WORDS else float(token))
    return numbers


def wrong_fact(question: str, answer: str) -> str | None:
    """What `answer` to `question` gets wrong that a program can check, in words, or None."""
    wrong = wrong_claims(answer)
    if wrong:
        return f"says {wrong[0]}"
    expected = expected_result(question)
    stated = stated_numbers(answer)
    if expected is not None and stated and all(abs(n - expected) > 1e-9 for n in stated):
        return f"does not give the result {_said(expected)}"
    return None
