"""Hindsight relabelling's pieces that need no model: hints, demonstrations, the hinted prompt,
edits of the first answer, and which sampled answers are kept (the samples scripted; the
model's revisions are tested in test_revision.py)."""

from __future__ import annotations

from collections import Counter

from reef.evaluation.tasks import ScorerSpec
from reef.protocol import Completion
from reef.sdk.feedback import demonstrations, hints
from reef.sdk.hindsight import (
    CONTENT_CHECK,
    answers_the_question,
    asked_for,
    edits,
    facts_kept,
    meets,
    relabel,
    with_hint,
)
from reef.sdk.view import Turn


def turn(*feedback: object, answer: str = "A pear.", question: str = "Name a fruit.") -> Turn:
    """A failed turn (score 0) with `feedback`: `question` asked, `answer` given."""
    reports = [{"score": 0.0, "feedback": f} for f in feedback]
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": question},
    ]
    return Turn("r1", messages, {"role": "assistant", "content": answer}, "base", reports)


def test_hints_are_feedback_texts_and_hint_objects_not_demonstrations() -> None:
    found = turn("Shorter, please.", {"hint": "Use one word."}, {"demonstration": "Apple."}, "  ")
    assert hints(found) == ["Shorter, please.", "Use one word."]
    assert demonstrations(found) == ["Apple."]


def test_a_failed_episode_s_test_output_is_a_hint_and_a_passed_one_is_not() -> None:
    report = {"episode": "ep-1", "task": "count-lines", "tree": "current", "agent": "native"}
    failed = {**report, "passed": False, "test_output": "FAIL:\n  count.txt holds count\n"}
    passed = {**report, "passed": True, "test_output": "PASS"}
    assert hints(turn(failed)) == ["The task's test failed and said: FAIL: count.txt holds count"]
    assert hints(turn(passed)) == []
    assert hints(turn({"passed": False, "test_output": "FAIL"})) == []  # not an episode's report


def test_the_hint_follows_the_last_user_message_and_nothing_else_changes() -> None:
    original = turn("x").messages
    hinted = with_hint(original, "Use one word.")
    assert hinted[0] == original[0]
    assert hinted[1] == {"role": "user", "content": "Name a fruit. Use one word."}
    assert original[1]["content"] == "Name a fruit."  # the turn's own messages are untouched
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]
    assert with_hint(parts, "Be brief.")[0]["content"] == "Name a fruit. Be brief."


def test_without_a_scorer_any_non_empty_answer_meets_the_hint() -> None:
    messages = turn().messages
    assert meets(None, "Apple.", messages) and not meets(None, "  ", messages)
    sure = ScorerSpec(type="regex", pattern=r"^\W*Sure")
    assert meets(sure, "Sure! Apple.", messages) and not meets(sure, "Apple.", messages)


def reply(text: str, finish: str = "stop", looped: bool = False) -> Completion:
    choice: dict = {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if looped:  # as the llama.cpp engine marks an answer it ended for repeating itself
        choice["reef"] = {"ended_by": "repetition"}
    return Completion(response={"choices": [choice]}, model="scripted", token_ids=[1, 2])


def test_an_answer_that_only_meets_the_preference_is_not_kept() -> None:
    """ "Sure!" alone meets "start with Sure" and says nothing; "Sure! A pear is a fruit." keeps
    the answer. The sampled answers are scripted: what is checked is which ones are kept."""
    sampled = iter(
        ["Sure!", "Sure! Sure! Sure!", "Sure! Bananas are yellow.", "Sure! Pear, sweet."]
    )
    found = turn("Start your answer with the word 'Sure!'")
    sure = ScorerSpec(type="regex", pattern=r"^\W*Sure")
    kept = relabel([found], lambda body: reply(next(sampled)), sure, samples=4, keep=2, revisions=0)
    # The first answer edited, then the one sampled answer that still says it.
    assert [item.answer for item in kept] == ["Sure! A pear.", "Sure! Pear, sweet."]
    assert not answers_the_question("Sure! Sure!", found, "Start your answer with 'Sure!'")
    assert answers_the_question("Sure, a pear.", found, "Start your answer with 'Sure!'")


def test_a_cut_answer_and_a_repeat_are_not_kept() -> None:
    sampled = iter(
        [reply("Sure! A pear", "length"), reply("Sure! A pear."), reply("Sure! A pear.")]
    )
    found = turn("Start with Sure")
    sure = ScorerSpec(type="regex", pattern=r"^\W*Sure")
    kept = relabel([found], lambda body: next(sampled), sure, samples=3, keep=3, revisions=0)
    assert [item.answer for item in kept] == ["Sure! A pear."]


def test_an_answer_the_engine_ended_for_looping_is_not_kept() -> None:
    """Clients are told such an answer stopped; it is a loop cut off, so no example of it, as
    sample or as revision (the 135M model told "Answer in French" loops on 2 of 6 training
    prompts greedily). This loop meets the scorer and the content check: only its mark stops it."""
    loop = "Sure! A pear, a pear, a pear, a pear, a pear, a pear, a pear, a pear"
    assert answers_the_question(loop, turn("Start with Sure"), "Start with Sure")
    sampled = iter([reply(loop, looped=True), reply("Sure! A pear.")])
    found = turn("Start with Sure")
    sure = ScorerSpec(type="regex", pattern=r"^\W*Sure")
    kept = relabel([found], lambda body: next(sampled), sure, samples=2, keep=2, revisions=0)
    assert [item.answer for item in kept] == ["Sure! A pear."]
    revised = iter([reply(loop, looped=True), reply("Sure! A pear, ripe.")])
    kept = relabel([found], lambda body: next(revised), sure, samples=0, keep=2, revisions=2)
    assert [item.answer for item in kept] == ["Sure! A pear, ripe."]


def test_the_text_feedback_asks_for_is_what_it_quotes_or_what_follows_its_colon() -> None:
    assert asked_for("Start your answer with the word 'Sure!'") == ["Sure!"]
    assert asked_for('Say "hello" first.') == ["hello"]
    assert asked_for("End every answer with the line: Cheers, Reef") == ["Cheers, Reef"]
    assert asked_for("Too long. Reply in five words or fewer.") == []
    # An instruction after a colon, or apostrophes inside words, ask for no text.
    assert asked_for("Too long: reply in five words.") == []
    assert asked_for("Don't ramble, it's rude.") == []
    assert asked_for("Sign with the words: Best, Ana") == ["Best, Ana"]


def test_an_instruction_after_a_colon_is_never_added_to_the_answer() -> None:
    found = turn("Too long: reply in five words.", answer="Paris.", question="Capital of France?")
    short = ScorerSpec(type="regex", pattern=r"^\W*(\S+\s+){0,4}\S+\W*$")
    kept = relabel([found], no_model_unless_sampled, short, samples=0, keep=2, revisions=0)
    assert all("reply" not in item.answer for item in kept)


def test_edits_keep_the_first_answer_and_never_give_the_asked_text_alone() -> None:
    edited = edits("Pears are sweet. They grow on trees.", "Start with 'Sure!'")
    assert "Sure! Pears are sweet. They grow on trees." in edited
    assert "Sure! Pears are sweet." in edited and "Pears are sweet." in edited
    assert "Pears are sweet. They grow on trees." not in edited  # the answer itself is no edit
    assert "Sure!" not in edited
    assert edits("  ", "Start with 'Sure!'") == []


def test_feedback_asking_for_two_texts_is_met_by_one_edit_with_both() -> None:
    """ "Start with 'Sure!' End with the line: Cheers, Reef" on "A pear.": an edit with one text
    before the answer and the other after it meets a scorer that asks for both, with no model."""
    asked = "Start your answer with the word 'Sure!' End every answer with the line: Cheers, Reef"
    found = turn(asked)
    both = ScorerSpec(type="regex", pattern=r"(?s)^(?=\W*Sure)(?=.*Cheers, Reef\W*$)")
    kept = relabel([found], no_model, both, samples=4, keep=1)
    assert [item.answer for item in kept] == ["Sure! A pear.\n\nCheers, Reef"]
    assert edits("A pear.", "Say 'hi'.")[0] == "hi A pear."  # one text: nothing to compose


def no_model_unless_sampled(body: dict) -> Completion:
    raise AssertionError("samples=0, revisions=0: nothing is asked")


def no_model(body: dict) -> Completion:
    raise AssertionError("an edit met the feedback: nothing had to be sampled")


def test_an_edit_of_the_first_answer_that_meets_the_feedback_is_kept_without_sampling() -> None:
    found = turn("End every answer with the line: Cheers, Reef")
    cheers = ScorerSpec(type="regex", pattern=r"Cheers, Reef\W*$")
    kept = relabel([found], no_model, cheers, samples=4, keep=1)
    assert [(item.answer, item.completion_token_ids) for item in kept] == [
        ("A pear.\n\nCheers, Reef", [])
    ]


def test_a_shorter_first_sentence_is_an_edit_a_length_scorer_can_keep() -> None:
    long = "Pears are sweet fruit. They grow on tall trees."
    found = turn("Too long. Reply in five words or fewer.", answer=long)
    short = ScorerSpec(type="regex", pattern=r"^\W*(\S+\s+){0,4}\S+\W*$")
    kept = relabel([found], no_model, short, samples=2, keep=1)
    assert [item.answer for item in kept] == ["Pears are sweet fruit."]


def test_without_a_scorer_nothing_is_edited_and_the_model_judges() -> None:
    """No scorer: no edit is tried (they are guesses only a scorer confirms); the sampled answer
    is kept once the model, asked whether it does what the feedback asks, says yes."""
    asked: list[str] = []

    def model(body: dict) -> Completion:
        content = body["messages"][-1]["content"]
        asked.append("judge" if "Reply with yes or no" in content else "sample")
        return reply("Yes." if asked[-1] == "judge" else "Sure! A pear.")

    kept = relabel([turn("Start with 'Sure!'")], model, None, samples=1, keep=2, revisions=0)
    assert [(item.answer, item.source) for item in kept] == [("Sure! A pear.", "sample")]
    assert asked == ["sample", "judge"]


def test_an_edit_of_a_wrong_answer_meets_a_form_feedback_and_is_dropped_and_counted() -> None:
    """The issue's example: feedback about form ("end with the line: Cheers") on "10 minus 4 =
    2" made "10 minus 4 = 2\n\nCheers", which meets the scorer and says what the first answer
    said. A program can check it: dropped, and counted as the content check."""
    wrong = turn(
        "End your answer with the line: Cheers",
        answer="10 minus 4 = 2",
        question="What is 10 minus 4?",
    )
    cheers = ScorerSpec(type="regex", pattern=r"Cheers\W*$")
    dropped: Counter[str] = Counter()
    sampled = iter([reply("10 minus 4 = 2. Cheers"), reply("10 minus 4 is 6.\n\nCheers")])
    kept = relabel(
        [wrong], lambda body: next(sampled), cheers, samples=2, keep=1, revisions=0, dropped=dropped
    )
    assert [item.answer for item in kept] == ["10 minus 4 is 6.\n\nCheers"]
    # The edits of the wrong answer and the wrong sample were refused; the call taught the right
    # one, so it counts as no drop (a call is counted once, and only when it taught nothing).
    assert dropped == Counter()
    right = turn(
        "End your answer with the line: Cheers", answer="Six.", question="What is 10 minus 4?"
    )
    assert [i.answer for i in relabel([right], no_model, cheers, samples=0, keep=1)] == [
        "Six.\n\nCheers"
    ]


def test_an_answer_that_only_repeats_the_question_keeps_no_fact_and_is_dropped() -> None:
    echo = turn(
        "End with the line: Cheers", answer="ice made of is ice.", question="What is ice made of?"
    )
    assert not facts_kept("ice made of is ice.\n\nCheers", echo, "End with the line: Cheers")
    assert facts_kept("Frozen water.\n\nCheers", echo, "End with the line: Cheers")
    dropped: Counter[str] = Counter()
    cheers = ScorerSpec(type="regex", pattern=r"Cheers\W*$")
    assert relabel([echo], no_model, cheers, samples=0, keep=1, revisions=0, dropped=dropped) == []
    assert dropped == Counter({CONTENT_CHECK: 1})  # one call, refused for its content


def test_a_relabel_brings_no_new_number_and_no_private_data() -> None:
    """Issue 72: "12 is the sum of 2 and 2, which is 4" was kept for "What is 2+2?" (12 was in
    neither the question nor the first answer), and a user's card number was copied into an
    example. A relabel changes the form, never adds content: both are dropped."""
    sum_of = turn("End with the line: Cheers", answer="4", question="What is 2+2?")
    hint = "End with the line: Cheers"
    assert not facts_kept("12 is the sum of 2 and 2, which is 4.\n\nCheers", sum_of, hint)
    assert facts_kept("2 + 2 is 4.\n\nCheers", sum_of, hint)
    wrong = turn(hint, answer="10 minus 4 = 2", question="What is 10 minus 4?")
    assert facts_kept("10 minus 4 is 6.\n\nCheers", wrong, hint)  # the result asked for
    card = turn(hint, answer="Your card is on file.", question="Is my card 4111 1111 1111 1111 ok?")
    assert not facts_kept("Your card 4111 1111 1111 1111 is on file.\n\nCheers", card, hint)


def test_a_numbered_list_asked_for_is_form_not_new_numbers() -> None:
    """Said another way: "answer as a numbered list" makes "1. Red", numbers neither the
    question nor the first answer said; they number the items and are kept."""
    hint = "Answer as a numbered list."
    colours = turn(hint, answer="Red, blue and green.", question="Name three colours.")
    assert facts_kept("1. Red\n2. Blue\n3. Green", colours, hint)
    assert not facts_kept("1. Red\n2. Blue, which is 7 times darker", colours, hint)
