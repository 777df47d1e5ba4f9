"""Facts a program can check in an answer, so that learning a form never teaches a wrong one.

Hindsight turns the model's own answer into the answer it should have given when the feedback
was about form ("end with the line: Cheers"): "10 minus 4 = 2\n\nCheers" meets the feedback and
keeps what the first answer said, and is wrong. What a program can verify it checks here, with
no model: arithmetic. `wrong_fact(question, answer)` says what is wrong, or None when nothing
checkable is:

- every arithmetic statement in the answer must hold: two expressions joined by `=`, `==`,
  "is", "equals", "makes", "gives", "leaves" or "is equal to", one of them with an operation
  in it, each evaluated exactly (`arithmetic`: fractions, the order of operations, powers,
  parentheses, percentages: "20% of 50"), after number words are read as digits (`text2num`:
  "ten minus four is three") and worded operations as their signs ("take away", "the sum of 2
  and 2", "to the power of");
- an answer to an arithmetic question, written with its sign or in words ("What is 10 minus
  4?", "Subtract 4 from 10."), that states numbers must state the result (a number word from
  zero to twenty counts).

Anything else (which element a metal is) no program here can check: a learner's examples are
held to the gate's correctness tasks with them in context instead (`docs/recipes.md`).
"""

from __future__ import annotations

import ast
import operator as op
import re
from fractions import Fraction

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
    for left, right, said in _claims(_as_signs(answer)):
        values = arithmetic(left), arithmetic(right)
        if values[0] is not None and values[1] is not None and values[0] != values[1]:
            operated = values[0] if _OPERATION.search(left) else values[1]
            wrong.append(f"{said} (it is {_said(float(operated))})")
    return wrong


# -- reading arithmetic in words ----------------------------------------------------------------

# Worded operations, as their signs (after number words are digits): order matters, longest first.
_AS_SIGNS = [
    (re.compile(rf"\bthe (?:sum|total) of ({_NUMBER}) and ({_NUMBER})", re.I), r"(\1 + \2)"),
    (re.compile(rf"\bthe product of ({_NUMBER}) and ({_NUMBER})", re.I), r"(\1 * \2)"),
    (re.compile(rf"({_NUMBER})\s*(?:%|percent) of ({_NUMBER})", re.I), r"(\1 / 100 * \2)"),
    (re.compile(r"\bto the power of\b|\braised to\b|\^", re.I), " ** "),
    (re.compile(r"\bmultiplied by\b|\btimes\b|(?<=\d)\s*[x\u00d7]\s*(?=\d)", re.I), " * "),
    (re.compile(r"\bdivided by\b|\u00f7", re.I), " / "),
    (re.compile(r"\bplus\b|\badded to\b", re.I), " + "),
    (re.compile(r"\bminus\b|\btake away\b|\u2212", re.I), " - "),
    (re.compile(r"\bis equal to\b|\bequals\b|\bmakes\b|\bgives\b|\bleaves\b|==", re.I), " = "),
]
_ARITHMETIC = r"[\d.\s+\-*/()]+"
_CLAIM_AT = re.compile(rf"({_ARITHMETIC})(?:=|\bis\b)({_ARITHMETIC})", re.I)
_OPERATION = re.compile(r"\d\s*(?:\*\*|[+\-*/])\s*\(?\s*-?\d")


def _as_signs(text: str) -> str:
    from text_to_num import alpha2digit

    text = alpha2digit(text.replace(",", ""), "en")
    for pattern, sign in _AS_SIGNS:
        text = pattern.sub(sign, text)
    return text


def _claims(text: str) -> list[tuple[str, str, str]]:
    """The statements `left = right` of `text` (signs already read), one side at least with an
    operation in it: (left, right, the statement as written here)."""
    found = []
    position = 0
    while (match := _CLAIM_AT.search(text, position)) is not None:
        left, right = match.group(1).strip(), match.group(2).strip().rstrip(".")
        if left and right and (_OPERATION.search(left) or _OPERATION.search(right)):
            found.append((left, right, " ".join(match.group(0).split()).rstrip(".")))
        position = match.start(2)  # "2 + 2 = 4 = 5": the right side starts the next claim
    return found


_BINARY = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv}
MAX_EXPONENT = 64  # "9 ** 9 ** 9" in an answer must not hang the learner


def arithmetic(expression: str) -> Fraction | None:
    """The exact value of an arithmetic expression (numbers, + - * / **, parentheses), or None
    for anything else, a division by zero, or a power too large to be a claim."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    try:
        return _value(tree.body)
    except (ZeroDivisionError, ValueError, OverflowError):
        return None


def _value(node: ast.expr) -> Fraction | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _value(node.left), _value(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Pow):
        if right.denominator != 1 or abs(right) > MAX_EXPONENT:
            return None
        return left ** int(right)
    operation = _BINARY.get(type(node.op))
    return None if operation is None else operation(left, right)


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


def states_the_answer(right: str, answer: str, question: str = "") -> bool:
    """Whether `answer` gives `right` as the answer and says nothing wrong beside it (the
    `answer` scorer): it says `right` (a number also as a word, "five"), states no arithmetic
    that does not hold, and, for a number, no other number than the question's ("15 is the sum
    of 2 and 3, which is 5" gives 5 and says 15; "6 or 8 legs" gives two)."""
    if wrong_claims(answer):
        return False
    try:
        wanted = float(right)
    except ValueError:
        return re.search(rf"(?i)(?<!\w){re.escape(right)}(?!\w)", answer) is not None
    stated = stated_numbers(_digits(answer))
    return wanted in stated and stated <= {wanted, *stated_numbers(_digits(question))}


def _digits(text: str) -> str:
    from text_to_num import alpha2digit

    return alpha2digit(text, "en")
