"""sft replays what the agent already answers elsewhere beside what it learns: the current
release's finished greedy answers (cut ones too, when asked) to the scenario's other questions
(the model is scripted: what is checked is which questions are asked and which answers become
examples)."""

from __future__ import annotations

from reef.protocol import Completion
from reef.recipes.sft.recipe import GENERAL_QUESTIONS, SFT, SFTSettings
from reef.sdk.recipe import StepContext


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_replay_answers_other_questions_as_the_current_release_does() -> None:
    asked: list[dict] = []

    def generate(body: dict) -> Completion:
        asked.append(body)
        question = body["messages"][-1]["content"]
        finish = "length" if question == "A long one?" else "stop"
        choice = {"message": {"content": f"About {question}"}, "finish_reason": finish}
        return Completion(
            response={"choices": [choice]},
            model="scripted",
            token_ids=[7, 8, 2],
            prompt_token_ids=[1, len(asked)],
        )

    context = StepContext(
        "default",
        "base",
        {},
        generate=generate,
        anchors=[ask("Learned already?"), ask("A long one?"), ask("Other?")],
    )
    recipe = SFT(SFTSettings(replay=3, max_tokens=64))
    learned = {tuple(map(str, ask("Learned already?")))}
    examples = recipe._replayed(context, learned)

    questions = [body["messages"][-1]["content"] for body in asked]
    # Not what is learned from; a cut answer is skipped; then the general questions fill in.
    assert questions == ["A long one?", "Other?", GENERAL_QUESTIONS[0], GENERAL_QUESTIONS[1]]
    assert all(body["temperature"] == 0 and body["max_tokens"] == 64 for body in asked)
    assert [e.completion_ids for e in examples] == [[7, 8, 2]] * 3
    assert [e.prompt_ids for e in examples] == [[1, 2], [1, 3], [1, 4]]
    assert SFT(SFTSettings(replay=0))._replayed(context, learned) == []


def test_a_cut_answer_replays_as_served_when_asked_to() -> None:
    def generate(body: dict) -> Completion:
        choice = {"message": {"content": "Bees make honey and"}, "finish_reason": "length"}
        return Completion(
            response={"choices": [choice]}, model="scripted", token_ids=[7, 8], prompt_token_ids=[1]
        )

    context = StepContext("default", "base", {}, generate=generate)
    assert SFT(SFTSettings(replay=2))._replayed(context, set()) == []
    kept = SFT(SFTSettings(replay=2, replay_cut_answers=True))._replayed(context, set())
    assert [e.completion_ids for e in kept] == [[7, 8]] * 2  # no end of turn added


def test_an_answer_ended_for_looping_is_never_replayed() -> None:
    """The engine tells clients a loop it cut off "stop"ped; replaying it would teach the loop,
    whether or not cut answers are replayed."""

    def generate(body: dict) -> Completion:
        choice = {
            "message": {"content": "Bees make honey, honey, honey, honey"},
            "finish_reason": "stop",
            "reef": {"ended_by": "repetition"},
        }
        return Completion(
            response={"choices": [choice]}, model="scripted", token_ids=[7, 8], prompt_token_ids=[1]
        )

    context = StepContext("default", "base", {}, generate=generate)
    assert SFT(SFTSettings(replay=2))._replayed(context, set()) == []
    assert SFT(SFTSettings(replay=2, replay_cut_answers=True))._replayed(context, set()) == []
