"""Relabelling by meaning: the model rewrites its own answer as the user's feedback asks.

The model is scripted: it understands one preference, "start with Sure", however a user phrases
it, and reads its own prompts (the revision prompt, the judge's question) by their fixed parts,
as any model reads its instructions. The code under test reads no feedback's wording: every
phrasing, quoted or plain, a complaint, a question or the user's next message, must yield a kept
answer, and an answer that loses what the first one said must not.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

import pytest

from reef.evaluation.judge import FOLLOWS_PROMPT
from reef.evaluation.tasks import ScorerSpec
from reef.protocol import Completion
from reef.recipes.harness_evolve.mutations import Mutation
from reef.recipes.harness_evolve.proposers import HindsightProposer
from reef.recipes.openclaw_rl.judge import Judgement
from reef.recipes.openclaw_rl.recipe import OpenClawRL, OpenClawRLSettings
from reef.sdk import hindsight
from reef.sdk.hindsight import REVISION_PROMPT, relabel, unwrapped
from reef.sdk.recipe import StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn
from tests.support.scripted import ask_of

QUESTION, FIRST_ANSWER = "Name a fruit.", "A pear."
# One preference, as users write it; the scripted model understands each of them.
PHRASINGS = {
    "quoted": "Start your answer with the word 'Sure!'",
    "plain": "start your answers with sure please",
    "complaint": "it annoys me that you never open with sure",
    "question": "why don't you ever begin by saying sure?",
}
NEXT_TURN = "no, say sure first next time"
MEANS_START_WITH_SURE = {*PHRASINGS.values(), NEXT_TURN}
SURE = ScorerSpec(type="regex", pattern=r"^\W*Sure")


def reply(text: str, finish: str = "stop") -> Completion:
    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return Completion(response={"choices": [choice]}, model="scripted", token_ids=[1, 2])


def filled(template: str, text: str) -> dict[str, str] | None:
    """The fields of `template` in `text` when `text` is `template` filled in, else None."""
    pattern = re.escape(template)
    for _, name, _, _ in string.Formatter().parse(template):
        if name:
            pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>.*)", 1)
    found = re.fullmatch(pattern, text, re.DOTALL)
    return found.groupdict() if found else None


class Model:
    """A model that starts with "Sure!" when its feedback means that, and keeps what it said.

    Asked to revise (`REVISION_PROMPT`): `revise(answer)` when the feedback means "start with
    Sure" (by default "Sure! <answer>" under a preface and in quotes, as chatty models write it),
    the answer unchanged otherwise. Asked to judge (`FOLLOWS_PROMPT`): yes when the feedback means
    it and the new answer starts with "Sure", or `judge` when given. Anything else (the question
    asked again with the hint beside it): the first answer unchanged, as a small model that
    rarely follows a hint. Every request body is kept in `asked`, by kind."""

    def __init__(
        self,
        revise: Callable[[str], str] = lambda answer: (
            f'Here is the rewritten answer:\n"Sure! {answer}"'
        ),
        judge: str | None = None,
    ) -> None:
        self.revise = revise
        self.judge = judge
        self.asked: list[tuple[str, dict]] = []

    def __call__(self, body: dict) -> Completion:
        content = body["messages"][-1]["content"]
        if (revision := filled(REVISION_PROMPT, content)) is not None:
            self.asked.append(("revision", body))
            wanted = revision["feedback"] in MEANS_START_WITH_SURE
            return reply(self.revise(revision["answer"]) if wanted else revision["answer"])
        if (judged := filled(FOLLOWS_PROMPT, content)) is not None:
            self.asked.append(("judge", body))
            meant = judged["feedback"] in MEANS_START_WITH_SURE
            follows = meant and judged["answer"].startswith("Sure")
            return reply(self.judge or ("Yes." if follows else "No."))
        self.asked.append(("sample", body))
        return reply(FIRST_ANSWER)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.asked]


def reported(feedback: str, answer: str = FIRST_ANSWER) -> Turn:
    """A turn scored 0 with `feedback` in the report."""
    messages = [{"role": "user", "content": QUESTION}]
    reports = [{"score": 0.0, "feedback": feedback}]
    return Turn("r1", messages, {"role": "assistant", "content": answer}, "base", reports)


def followed_by(message: str) -> Turn:
    """A turn nobody scored, whose conversation went on with the user's `message`."""
    messages = [{"role": "user", "content": QUESTION}]
    answer = {"role": "assistant", "content": FIRST_ANSWER}
    return Turn("r2", messages, answer, "base", next_state=[{"role": "user", "content": message}])


FEEDBACK = [pytest.param(reported(text), id=name) for name, text in PHRASINGS.items()]
FEEDBACK += [pytest.param(followed_by(NEXT_TURN), id="next-turn")]


@pytest.mark.parametrize("scorer", [SURE, None], ids=["scorer", "judge"])
@pytest.mark.parametrize("failed", FEEDBACK)
def test_every_phrasing_of_one_preference_yields_a_kept_revision(
    failed: Turn, scorer: ScorerSpec | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no edit of the first answer (the only candidates read off the feedback's form), the
    model's revision is kept, unwrapped, whatever the phrasing: from a report or the next turn."""
    monkeypatch.setattr(hindsight, "edits", lambda answer, hint: [])
    model = Model()
    kept = relabel([failed], model, scorer, samples=0, keep=1)
    assert [(item.answer, item.source, item.completion_token_ids) for item in kept] == [
        ("Sure! A pear.", "revision", [])
    ]
    assert kept[0].hint in MEANS_START_WITH_SURE
    assert model.kinds() == ["revision"] + (["judge"] if scorer is None else [])


@pytest.mark.parametrize(
    "revision",
    [
        "Sure!",
        "Sure! Sure! Sure!",
        "Sure! Bananas are yellow.",
        "Here is the rewritten answer: Ok.",
    ],
)
@pytest.mark.parametrize("scorer", [SURE, None], ids=["scorer", "judge"])
def test_a_revision_that_drops_the_answer_is_refused(
    revision: str, scorer: ScorerSpec | None
) -> None:
    """The revision meets the feedback (or the judge says so) and says nothing the question or the
    first answer said: not kept, however often asked."""
    model = Model(revise=lambda answer: revision, judge="Yes")
    failed = reported(PHRASINGS["plain"])
    assert relabel([failed], model, scorer, samples=0, keep=1, revisions=3) == []
    assert model.kinds() == ["revision"] * 3  # never judged: the content check comes first


@pytest.mark.parametrize("scorer", [SURE, None], ids=["scorer", "judge"])
def test_a_revision_that_echoes_the_revision_prompt_is_cut_where_the_echo_starts(
    scorer: ScorerSpec | None,
) -> None:
    """The 135M model writes a rewrite, then the prompt's next line and its first answer again:
    what it echoes repeats the first answer's words and would pass the content check. The echo
    is cut off; what comes before it is judged on its own."""
    echo = f"\n\nThe user's feedback on your answer:\n{FIRST_ANSWER}"
    kept = relabel([reported(PHRASINGS["plain"])], Model(lambda a: f"Sure! {a}{echo}"), scorer)
    assert [item.answer for item in kept] == ["Sure! A pear."]
    # What it copies (the question, its first answer) would pass the content check alone.
    copied = f"\n\nA user asked:\n{QUESTION}\n\nYou answered:\n{FIRST_ANSWER}"
    said_nothing = Model(revise=lambda answer: f"Sure!{copied}", judge="Yes")
    assert relabel([reported(PHRASINGS["plain"])], said_nothing, scorer, samples=0) == []


def test_a_line_that_only_starts_like_the_revision_prompt_is_not_cut() -> None:
    assert hindsight.before_echo("You answered: 4. The right answer is 5.") == (
        "You answered: 4. The right answer is 5."
    )
    assert hindsight.before_echo("Sure!\nThe user\u2019s feedback on your answer:\nA pear.") == (
        "Sure!"
    )


def test_a_revision_that_keeps_the_answer_and_follows_the_feedback_is_kept() -> None:
    model = Model(revise=lambda answer: "Sure, a pear is a fruit.")
    kept = relabel([reported(PHRASINGS["complaint"])], model, SURE, samples=0, keep=1)
    assert [item.answer for item in kept] == ["Sure, a pear is a fruit."]


def test_the_first_answer_given_back_is_never_kept_whatever_the_judge_says() -> None:
    unchanged = Model(revise=lambda answer: f"  {answer}", judge="Yes")
    failed = reported(PHRASINGS["plain"])
    assert relabel([failed], unchanged, None, samples=2, keep=1) == []
    assert "judge" not in unchanged.kinds()


def test_a_judge_that_says_no_keeps_nothing_and_a_cut_revision_is_never_judged() -> None:
    said_no = Model(judge="No, it does not.")
    assert relabel([reported(PHRASINGS["plain"])], said_no, None, samples=0, keep=1) == []
    assert said_no.kinds() == ["revision", "judge", "revision", "judge"]

    def cut(body: dict) -> Completion:
        return reply("Sure! A pear", finish="length")

    assert relabel([reported(PHRASINGS["plain"])], cut, None, samples=0, keep=1) == []


def test_revisions_use_seeds_the_first_greedy_and_stop_once_enough_are_kept() -> None:
    """Each revision has its own seed (the first at temperature 0); with `keep` met nothing more
    is asked, and samples under the hint come only after the revisions."""
    rewrites = iter(["Sure! A pear.", "Sure, a pear.", "Sure! Pear."])
    model = Model(revise=lambda answer: next(rewrites))
    kept = relabel([reported(PHRASINGS["plain"])], model, SURE, samples=4, keep=2, revisions=3)
    assert [item.answer for item in kept] == ["Sure! A pear.", "Sure, a pear."]
    asked = [body for _, body in model.asked]
    assert [(body["seed"], body["temperature"]) for body in asked] == [(0, 0.0), (1, 0.8)]

    model = Model(revise=lambda answer: answer)  # a model that never revises
    assert relabel([reported(PHRASINGS["plain"])], model, SURE, samples=2, keep=1) == []
    assert model.kinds() == ["revision", "revision", "sample", "sample"]


def test_a_reviser_given_rewrites_and_judges_and_the_served_model_only_samples() -> None:
    served, reviser = Model(revise=lambda answer: answer), Model()
    kept = relabel(
        [reported(PHRASINGS["question"])], served, None, samples=1, keep=2, reviser=reviser
    )
    assert [item.answer for item in kept] == ["Sure! A pear."]
    assert served.kinds() == ["sample"]
    # The first revision, judged once unwrapped (as it came, its preface fails the content
    # check); the second, a repeat; the sample is the first answer again: never judged.
    assert reviser.kinds() == ["revision", "judge", "revision"]


@pytest.mark.parametrize(
    ("revision", "answer"),
    [
        ("Here is the rewritten answer:\nSure! A pear.", "Sure! A pear."),
        ("Sure! Here's the revised version:\n\n\u201cSure! A pear.\u201d", "Sure! A pear."),
        ('Rewritten answer: "Sure! A pear."', "Sure! A pear."),
        ("'Sure! A pear.'", "Sure! A pear."),
        ("```\nSure! A pear.\n```", "Sure! A pear."),
        ("  Sure! A pear.  ", "Sure! A pear."),
        # What the answer says is no wrapper: a colon inside it, quotes inside it.
        ("Pear: a sweet fruit.", "Pear: a sweet fruit."),
        ("A pear, ripe at 10:30.", "A pear, ripe at 10:30."),
        ('"Sure!" I said. "A pear."', '"Sure!" I said. "A pear."'),
    ],
)
def test_what_the_model_puts_around_its_revision_is_taken_off(revision: str, answer: str) -> None:
    assert unwrapped(revision, reported("x")) == answer


def test_the_hindsight_proposer_shows_a_revision_of_plain_feedback_as_a_worked_example() -> None:
    failures = [reported(PHRASINGS["plain"])]
    mutation = HindsightProposer(Model(), SURE, samples=1).propose(
        failures, StepContext("default", "base", {})
    )
    assert isinstance(mutation, Mutation) and mutation.path == "examples.jsonl"
    assert mutation.content == '{"user": "Name a fruit.", "assistant": "Sure! A pear."}\n'


def test_openclaw_rl_relabels_the_turns_judged_wanting_from_the_next_message() -> None:
    """The user's next message takes the report's path: the turn judged -1 is relabelled from
    what the user said next; the one judged +1 is not asked about."""
    wanting = followed_by(NEXT_TURN)
    fine = followed_by("thanks, that helps")
    model = Model()
    recipe = OpenClawRL(OpenClawRLSettings())
    judged = [(wanting, Judgement(-1, "keywords")), (fine, Judgement(1, "keywords"))]
    found = recipe.hindsight_answers(judged, StepContext("default", "base", {}, generate=model))
    assert [(item.turn, item.hint, item.answer) for item in found] == [
        (wanting, NEXT_TURN, "Sure! A pear.")
    ]
    assert model.kinds() == ["revision", "judge"]
    off = OpenClawRL(OpenClawRLSettings(revisions=0))
    assert off.hindsight_answers(judged, StepContext("default", "base", {}, generate=model)) == []


def test_the_proposer_model_revises_when_the_settings_choose_it() -> None:
    """harness_evolve with `reviser: proposer`: the proposer model (`ask`) rewrites, the served
    model, which never follows feedback here, is only sampled."""
    served, proposer = Model(revise=lambda answer: answer), Model()

    settings = {"proposer": "hindsight", "reviser": "proposer", "scorer": SURE.model_dump()}
    recipe = load_recipe("harness_evolve", settings)
    context = StepContext("default", "base", {}, ask=ask_of(proposer), generate=served)
    proposal = recipe.propose([Trajectory("t1", [reported(PHRASINGS["plain"])])], context)
    assert proposal is not None
    assert (
        proposal.files["examples.jsonl"]
        == b'{"user": "Name a fruit.", "assistant": "Sure! A pear."}\n'
    )
    assert proposer.kinds() == ["revision"] and served.kinds() == []
