"""What a program checks of an answer's facts: arithmetic statements, and the result an
arithmetic question asks for."""

from __future__ import annotations

import pytest

from reef.evaluation.facts import expected_result, wrong_claims, wrong_fact


@pytest.mark.parametrize(
    ("question", "answer", "wrong"),
    [
        ("What is 10 minus 4?", "10 minus 4 = 2\n\nCheers", "says 10 - 4 = 2 (it is 6)"),
        ("What is 5+5?", "Four.", "does not give the result 10"),
        ("What is 5+5?", "5 + 5 = 10. Cheers", None),
        ("What is 10 minus 4?", "Six.\n\nCheers", None),
        ("What is 3 times 4?", "3 times 4 is 12", None),
        ("What is 2-3?", "2 - 3 = -1", None),
        ("What is 7 * 8?", "It is 56, since 7 x 8 makes 56.", None),
        ("What is 12 divided by 4?", "12 / 4 = 4", "says 12 / 4 = 4 (it is 3)"),
        ("What is the capital of France?", "Paris. Cheers", None),  # nothing to check
        ("Name a year.", "2020-12-01, a Tuesday.", None),  # a date is not a subtraction
        ("How many legs does a cat have?", "A cat has 4 legs: 2 x 2 is 5.", "says 2 * 2 is 5"),
        # The same questions asked in words, not with a sign.
        ("Add 5 and 6.", "5 and 6 make 12.", "does not give the result 11"),
        ("What is the sum of 5 and 6?", "Eleven.", None),
        ("Subtract 4 from 10.", "Six, of course.", None),
        ("Subtract 4 from 10.", "It leaves 14.", "does not give the result 6"),
        ("What is the product of 3 and 4?", "7", "does not give the result 12"),
        ("Divide 12 by 3, please.", "That gives 4.", None),
        ("What is the difference between 4 and 10?", "The difference is 6.", None),
        ("What is the difference between 4 and 10?", "It is 5.", "does not give the result 6"),
    ],
)
def test_what_a_program_can_check_is_checked(question: str, answer: str, wrong: str | None) -> None:
    found = wrong_fact(question, answer)
    assert found == wrong if wrong is None else (found or "").startswith(wrong)


def test_an_answer_without_numbers_to_an_arithmetic_question_says_nothing_checkable() -> None:
    assert wrong_fact("What is 5+5?", "I would rather not say.") is None
    assert expected_result("What is 10 minus 4?") == 6
    assert expected_result("Is 3 + 4 more than 2 + 2?") is None  # two expressions: not one result
    assert wrong_claims("1,000 + 1 = 1,001 and 7 / 0 = 1") == []  # thousands; no division by zero


# Issue 72's wrong statements, which the check of `a op b = c` alone let through, and more forms.
WRONG = [
    "Ten minus four is three.",
    "10 take away 4 leaves 2",
    "2 + 2 == 5",
    "20% of 50 is 25.",
    "2^10 = 1000.",
    "12 minus 4 is 1. Cheers",
    "12 is the sum of 2 and 2, which is 4.",
    "Twelve divided by three is five.",
    "2 + 3 * 4 = 20",
    "The product of 3 and 4 is 13.",
    "3 to the power of 2 is 6",
    "(2 + 3) * 4 = 14",
    "twenty percent of fifty is twenty-five",
]
# Right statements it refused, and sentences with numbers that claim no arithmetic.
RIGHT = [
    "2 + 3 * 4 = 14",
    "1/2 + 1/4 = 3/4",
    "10 minus 4 is 6.",
    "20% of 50 is 10.",
    "2^10 = 1024",
    "(2 + 3) * 4 = 20",
    "In 2023 there were 5 cats.",
    "I am 25 years old and it is 2026.",
    "Version 3.11 is out.",
    "2 + 2 is 4, and 3 + 3 is 6.",
    "9 ** 9 ** 9 is big",  # a power too large to be a claim: not evaluated
]


@pytest.mark.parametrize("answer", WRONG)
def test_a_wrong_statement_in_any_form_is_found(answer: str) -> None:
    assert wrong_claims(answer), answer


@pytest.mark.parametrize("answer", RIGHT)
def test_a_right_statement_is_not_refused(answer: str) -> None:
    assert wrong_claims(answer) == [], answer
