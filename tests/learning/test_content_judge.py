"""Whether a rewrite still answers, in another language than the question's.

Hindsight keeps a rewrite only when it still answers the question. By words, that holds within
one language: "La capitale de la France est Paris." shares too few words with "What is the
capital of France?" and is refused, right as it is. A recipe's `content_check: proposer` has the
proposer model judge instead. The models here are scripted (`Bilingual`): the reviser answers in
French, and the judge says yes exactly for the answers its table knows to be right, so each
outcome is certain.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from reef.evaluation.tasks import ScorerSpec
from reef.protocol import Completion
from reef.recipes.harness_evolve.mutations import MutationRefused
from reef.sdk.hindsight import CONTENT_PROMPT, REVISION_PROMPT, content_judge_for, relabel
from reef.sdk.recipe import RecipeError, StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn
from tests.support.scripted import ask_of

QUESTION, FIRST_ANSWER = "What is the capital of France?", "The capital of France is Paris."
IN_FRENCH = "please answer me in french from now on"
RIGHT = "La capitale de la France est Paris."
FRENCH = ScorerSpec(type="regex", pattern=r"(?i)\b(la|le|les|est)\b")
# What the judge knows to answer the question, in either language.
ANSWERS = {QUESTION: {FIRST_ANSWER, RIGHT}}


def reply(text: str) -> Completion:
    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return Completion(response={"choices": [choice]}, model="scripted", token_ids=[1, 2])


class Bilingual:
    """Revises any answer into `revision`; asked whether an answer answers a question
    (`CONTENT_PROMPT`), says yes exactly when `ANSWERS` has it; samples the first answer."""

    def __init__(self, revision: str = RIGHT) -> None:
        self.revision = revision
        self.asked: list[str] = []
        self.judged_at: list[float] = []  # the temperature of each content question

    def __call__(self, body: dict[str, Any]) -> Completion:
        content = body["messages"][-1]["content"]
        if content.startswith(REVISION_PROMPT.split("{")[0]) and "Rewrite your answer" in content:
            self.asked.append("revision")
            return reply(self.revision)
        for question, right in ANSWERS.items():
            for answer in right | {self.revision}:
                if content == CONTENT_PROMPT.format(question=question, answer=answer):
                    self.asked.append("content")
                    self.judged_at.append(body.get("temperature", 1.0))
                    return reply("Yes." if answer in right else "No.")
        self.asked.append("sample")
        return reply(FIRST_ANSWER)


def reported(feedback: str = IN_FRENCH) -> Turn:
    messages = [{"role": "user", "content": QUESTION}]
    reports = [{"score": 0.0, "feedback": feedback}]
    return Turn("r1", messages, {"role": "assistant", "content": FIRST_ANSWER}, "base", reports)


def test_by_words_a_right_answer_in_french_is_refused() -> None:
    """The defect the judge mends: the default check refuses the right French answer."""
    model = Bilingual()
    assert relabel([reported()], model, FRENCH, samples=0, keep=1, revisions=1) == []
    assert "content" not in model.asked


def test_the_content_judge_keeps_a_right_answer_in_another_language() -> None:
    model, judge = Bilingual(), Bilingual()
    kept = relabel([reported()], model, FRENCH, samples=0, keep=1, revisions=1, content_judge=judge)
    assert [(item.answer, item.source) for item in kept] == [(RIGHT, "revision")]
    assert judge.asked == ["content"]


def test_the_content_judge_refuses_french_words_that_do_not_answer() -> None:
    """French that the scorer accepts, but that answers nothing, as the 135M model writes it."""
    model, judge = Bilingual("La fer de la fer."), Bilingual("La fer de la fer.")
    kept = relabel([reported()], model, FRENCH, samples=0, keep=1, revisions=1, content_judge=judge)
    assert kept == []
    assert judge.asked == ["content"]


def test_an_answer_that_says_only_the_feedback_is_refused_before_the_judge_is_asked() -> None:
    model, judge = Bilingual("French!"), Bilingual()
    answer_in_french = ScorerSpec(type="regex", pattern="French")
    kept = relabel(
        [reported("answer in French!")],
        model,
        answer_in_french,
        samples=0,
        keep=1,
        revisions=1,
        content_judge=judge,
    )
    assert kept == [] and judge.asked == []


def test_content_check_words_gives_no_judge_and_proposer_needs_the_proposer() -> None:
    assert content_judge_for("words", None) is None
    with pytest.raises(RecipeError, match="proposer model"):
        content_judge_for("proposer", None)


def harness_evolve_with(check: str) -> tuple[Any, StepContext, Bilingual]:
    """harness_evolve revising by the proposer (which answers in French), with `check`."""
    proposer, served = Bilingual(), Bilingual(FIRST_ANSWER)
    settings = {
        "proposer": "hindsight",
        "reviser": "proposer",
        "content_check": check,
        "scorer": FRENCH.model_dump(),
        "hindsight_samples": 1,
    }
    context = StepContext("default", "base", {}, ask=ask_of(proposer), generate=served)
    return load_recipe("harness_evolve", settings), context, proposer


def test_harness_evolve_with_content_check_proposer_keeps_the_french_answer() -> None:
    """The proposer model, which revised into French, also judges, greedily, whether the French
    answers."""
    recipe, context, proposer = harness_evolve_with("proposer")
    proposal = recipe.propose([Trajectory("t1", [reported()])], context)
    assert proposal is not None
    shown = {"user": QUESTION, "assistant": RIGHT}
    assert proposal.files["examples.jsonl"] == (json.dumps(shown) + "\n").encode()
    assert proposer.asked == ["revision", "content"] and proposer.judged_at == [0.0]


def test_harness_evolve_by_words_refuses_the_same_french_answer() -> None:
    recipe, context, proposer = harness_evolve_with("words")
    with pytest.raises(MutationRefused, match="no answer given under the feedback"):
        recipe.propose([Trajectory("t1", [reported()])], context)
    assert "content" not in proposer.asked


def test_sft_with_content_check_proposer_learns_the_french_answer() -> None:
    """`sft`'s examples: the French revision with the proposer judging, none by words."""
    from reef.recipes.sft.recipe import SFT, SFTSettings

    def examples(check: str) -> list[tuple[Turn, list[int] | str]]:
        proposer, served = Bilingual(), Bilingual(FIRST_ANSWER)
        settings = SFTSettings(
            reviser="proposer", content_check=check, scorer=FRENCH, hindsight_samples=1
        )
        context = StepContext("default", "base", {}, ask=ask_of(proposer), generate=served)
        return SFT(settings)._completions([reported()], context)

    assert [answer for _, answer in examples("proposer")] == [RIGHT]
    assert examples("words") == []
