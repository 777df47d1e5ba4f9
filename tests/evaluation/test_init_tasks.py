"""The eval tasks `reef init` writes check the answer, not a number somewhere in it (issue 71).

Their regular expressions passed "15 is the sum of 2 and 3, which is 5. Cheers" for 2 + 3: the
`answer` scorer needs the right answer stated, nothing wrong beside it, and a short answer."""

from __future__ import annotations

import pytest

from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask
from reef.testing.scripted_user import correctness_tasks

TASKS = {
    task.id: task
    for task in (EvalTask.model_validate_json(line) for line in correctness_tasks().splitlines())
}

# Answers the old regular expressions passed, and each is wrong.
WRONG = [
    ("two-plus-three", "15 is the sum of 2 and 3, which is 5. Cheers"),
    ("two-plus-three", "The answer is 5, or maybe 6."),
    ("two-plus-three", "2 + 3 = 6, so about 5."),
    ("legs-of-a-spider", "A spider has 8 legs, or 6 when young."),
    ("legs-of-a-spider", "Eight legs, because 4 + 4 = 9."),
    ("capital-of-france", "Lyon, and Paris is 2 + 2 = 5 km away."),
]
RIGHT = [
    ("two-plus-three", "5"),
    ("two-plus-three", "2 + 3 = 5."),
    ("two-plus-three", "Five."),
    ("legs-of-a-spider", "Spiders have eight legs."),
    ("capital-of-france", "The capital of France is Paris. Cheers"),
    ("opposite-of-hot", "Cold."),
    ("symbol-for-gold", "Au"),
    ("capital-of-japan", "Tokyo is the capital of Japan."),
]


@pytest.mark.parametrize(("task", "answer"), WRONG)
def test_a_wrong_answer_with_the_right_number_in_it_fails(task: str, answer: str) -> None:
    assert score(TASKS[task].scorer, answer, TASKS[task]) == 0.0


@pytest.mark.parametrize(("task", "answer"), RIGHT)
def test_a_right_answer_passes(task: str, answer: str) -> None:
    assert score(TASKS[task].scorer, answer, TASKS[task]) == 1.0


def test_a_long_answer_fails_as_before() -> None:
    task = TASKS["capital-of-france"]
    assert score(task.scorer, "Paris. " + "It is lovely in spring. " * 5, task) == 0.0
