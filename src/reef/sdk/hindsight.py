"""Hindsight relabelling: what the model would have answered had it known what the user wanted.

A turn the user scored low, with feedback, becomes answers the model should have given. The
feedback is the user's own words, whatever their form: a report's text (`hints`) or, in a
conversation, the user's next message (`next_message`, the signal openclaw_rl reads); both take
the same path (`relabel`). Candidates, in order:

- **edits** of the first answer, where the recipe has a scorer to confirm them (`edits`): the
  text the feedback quotes put before or after it, its first sentence, a bullet point. Guesses
  from the feedback's form, one more source, never the only one;
- **revisions**: a model (the served one, or any `reviser` a recipe passes) is asked to rewrite
  its first answer so that it does what the feedback asks and keeps what it said
  (`REVISION_PROMPT`), `revisions` times with seeds, the first greedy; what it puts around the
  answer ("Here is the rewritten answer:", quotes) is taken off (`unwrapped`), and so is all it
  writes once it starts copying the prompt's own lines (`before_echo`). The model reads
  the feedback's meaning: no code here parses its wording, so "start with Sure", "why do you
  never say sure first?" and "no, say sure" all work;
- **samples**: the question asked again with the feedback beside the user's message (small
  models follow text there far better than in a system prompt), `samples` times, the first greedy.

A candidate is kept first when it keeps to facts (`facts_kept`): it says something beyond the
question's and the feedback's words, and nothing a program finds wrong (an arithmetic statement
that does not hold, a wrong result to an arithmetic question: `reef.evaluation.facts`), since
the feedback asked for a form, not for the content the model got wrong. Then when it still
answers the question: beyond the feedback's own words, it says
something, and mostly what the question or the first answer said (`answers_the_question`, with
`evaluation.content.grounded`): "Sure!" alone meets "start with Sure" and says nothing, "Sure!
Paris." keeps the answer. Words hold only within one language ("Le ciel est bleu." shares none
with "What colour is the sky?"), so where a recipe gives a `content_judge`, a model that reads
both languages such as the proposer, that model says whether the answer answers the question
instead (`keeps`, `CONTENT_PROMPT`). And when it meets the feedback: the recipe's scorer accepts
it, or, without a scorer, the reviser as judge says it does what the feedback asks (`follows`, a
yes/no question; a model that small says yes too easily, which the content check bounds). Kept
answers are the training signal: a LoRA learns to give them without the hint (`sft`, and
`openclaw_rl` as answers with a positive advantage), or a harness shows them as worked examples
(`harness_evolve`). No preference is coded here. (A correction whose whole content is in the
feedback, "No: 9", is better given as a demonstration.)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import permutations
from typing import Any, Literal

from reef.evaluation.content import content_words, grounded
from reef.evaluation.facts import expected_result, stated_numbers, wrong_fact
from reef.evaluation.judge import FOLLOWS_PROMPT, judge_body, says_yes
from reef.evaluation.private import first_private
from reef.evaluation.scorers import score
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.protocol import Completion, message_text
from reef.sdk.feedback import feedback_of
from reef.sdk.recipe import RecipeError
from reef.sdk.view import Turn

# Runs an OpenAI chat request body on the model under the scenario's current release, unrecorded.
Generate = Callable[[dict[str, Any]], Completion]
HINT_TEMPLATE = "{message} {hint}"  # right after the request: where small models listen
REVISION_PROMPT = """A user asked:
{question}

You answered:
{answer}

The user's feedback on your answer:
{feedback}

Rewrite your answer so that it does what the feedback asks, and keep what it says. Reply with \
the rewritten answer only."""
CONTENT_PROMPT = """A user asked:
{question}

An answer:
{answer}

Does this answer the user's question, in whatever language or words it is written? Reply with \
yes or no."""


@dataclass
class Relabelled:
    """An answer that meets the feedback, for the turn's original messages."""

    turn: Turn
    hint: str  # the feedback it meets
    answer: str
    completion_token_ids: list[int]  # as the model produced them, ending with its end token;
    # empty for an edit or a revision (given to another prompt): train on `answer`'s text
    source: Literal["edit", "revision", "sample"] = "sample"


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The messages with `hint` appended to the last user message."""
    hinted = [dict(m) for m in messages]
    for message in reversed(hinted):
        if message.get("role") == "user":
            text = message_text(message.get("content"))
            message["content"] = HINT_TEMPLATE.format(message=text, hint=hint)
            return hinted
    return [*hinted, {"role": "user", "content": hint}]


# -- does a candidate still answer, and meet the feedback ---------------------------------------

# Of an answer's content words beyond the feedback's, the share the question or the first answer
# must have said.
GROUNDED = 0.5


def answers_the_question(answer: str, turn: Turn, hint: str) -> bool:
    """Whether a hindsight answer still answers: it says something beyond the feedback's words,
    and mostly what the question or the original answer said."""
    feedback = content_words(hint)
    own = " ".join(sorted(content_words(answer) - feedback))
    return grounded(own, [turn.prompt, turn.answer_text]) >= GROUNDED


def says_more_than(answer: str, hint: str) -> bool:
    """Whether `answer` has content words beyond the feedback's own: "Sure!" under "start with
    Sure" says nothing more."""
    return bool(content_words(answer) - content_words(hint))


def judged_answering(judge: Generate, answer: str, turn: Turn) -> bool:
    """Whether the `judge` model says `answer` answers the turn's question, in any language:
    its reply to `CONTENT_PROMPT` starts with yes."""
    prompt = CONTENT_PROMPT.format(question=turn.prompt, answer=answer)
    return _says_yes(judge, prompt)


def meets(scorer: ScorerSpec | None, answer: str, messages: list[dict[str, Any]]) -> bool:
    """Whether `scorer` accepts `answer` (any non-empty answer, without a scorer)."""
    if scorer is None:
        return bool(answer.strip())
    task = EvalTask(id="hindsight", messages=messages, scorer=scorer)
    return score(scorer, answer, task) >= 0.5


def follows(judge: Generate, answer: str, turn: Turn, hint: str) -> bool:
    """Whether the `judge` model says `answer` does what the feedback `hint` asks: its greedy
    reply to `FOLLOWS_PROMPT` (the gate's judge asks the same) starts with yes."""
    prompt = FOLLOWS_PROMPT.format(question=turn.prompt, feedback=hint, answer=answer)
    return _says_yes(judge, prompt)


def _says_yes(judge: Generate, prompt: str) -> bool:
    """Whether the `judge` model's greedy reply to `prompt` starts with yes."""
    return says_yes(_text(judge(judge_body(prompt))))


def accepted(
    scorer: ScorerSpec | None, judge: Generate, answer: str, turn: Turn, hint: str
) -> bool:
    """Whether `answer` meets the feedback: the scorer says so, or, without one, the judge."""
    if scorer is not None:
        return meets(scorer, answer, turn.messages)
    return bool(answer.strip()) and follows(judge, answer, turn, hint)


CONTENT_CHECK = "content check"  # why a relabelled answer was dropped (`StepContext.drop`)
# Why a turn with feedback taught nothing: no answer met it (as the recipe's scorer reads it, or,
# without one, the model that judges).
NOTHING_MET = "no answer met the feedback"
NO_FEEDBACK_TEXT = "no feedback text"  # a failing turn nobody said anything about


def facts_kept(answer: str, turn: Turn, hint: str) -> bool:
    """Whether a relabelled answer keeps to facts as far as a program can tell: it says
    something beyond the question's and the feedback's own words ("ice made of is ice." to
    "What is ice made of?" says nothing), nothing a checker finds wrong ("10 minus 4 = 2",
    `reef.evaluation.facts`), no number that neither the question, the first answer nor the
    feedback said ("12 is the sum of 2 and 2" to "What is 2+2?"; the result an arithmetic
    question asks for may be new: it corrects a wrong first answer), and no private data
    (`reef.evaluation.private`). Hindsight may change the form the feedback asked for, never
    teach content the model got wrong, or another user's."""
    beyond = says_more_than(answer, f"{hint} {turn.prompt}")
    said_before = stated_numbers(f"{turn.prompt} {turn.answer_text} {hint}")
    said_before |= _list_markers(answer)  # "1. Red" numbers the list, says nothing of red
    asked_for = expected_result(turn.prompt)
    if asked_for is not None:
        said_before.add(asked_for)
    new_numbers = stated_numbers(answer) - said_before
    return (
        beyond
        and not new_numbers
        and wrong_fact(turn.prompt, answer) is None
        and first_private(answer) is None
    )


def sound_answers(turn: Turn, answers: list[str], dropped: Counter[str] | None = None) -> list[str]:
    """The answers given for `turn` outside hindsight (a user's or a teacher's demonstration,
    an answer users scored well) that a program finds nothing wrong in (`wrong_fact`: "12
    minus 4 is 1"); each it refuses counted under `CONTENT_CHECK` in `dropped`. A demonstration
    is the user's own content, so only what a program can check wrong refuses it; private data
    has kept its call out of learning already (`ExperienceView`)."""
    kept = [answer for answer in answers if wrong_fact(turn.prompt, answer) is None]
    if dropped is not None and len(kept) < len(answers):
        dropped[CONTENT_CHECK] += len(answers) - len(kept)
    return kept


_LIST_MARKER = re.compile(r"(?m)^\s*(\d+)[.)]\s")


def _list_markers(answer: str) -> set[float]:
    """The numbers of a numbered list's items: form, which feedback may ask for."""
    return {float(number) for number in _LIST_MARKER.findall(answer)}


def keeps(
    answer: str,
    turn: Turn,
    hint: str,
    scorer: ScorerSpec | None,
    reviser: Generate,
    content_judge: Generate | None = None,
) -> bool:
    """Whether `relabel` keeps an answer that keeps to facts (`facts_kept`, which it checks
    first, to count what that drops): it still answers the question and meets the feedback.
    Whether it answers is judged by words (`answers_the_question`) or, with a `content_judge`,
    by that model (it says more than the feedback, and the judge says it answers: the check
    that holds in another language than the question's). Cheap checks first, models last."""
    if content_judge is None:
        return answers_the_question(answer, turn, hint) and accepted(
            scorer, reviser, answer, turn, hint
        )
    return (
        says_more_than(answer, hint)
        and accepted(scorer, reviser, answer, turn, hint)
        and judged_answering(content_judge, answer, turn)
    )


# -- revisions ------------------------------------------------------------------------------------


def revision_request(
    turn: Turn, hint: str, seed: int, temperature: float, max_tokens: int
) -> dict[str, Any]:
    """The request asking a model to rewrite the turn's answer as the feedback asks (the first,
    seed 0, greedy)."""
    prompt = REVISION_PROMPT.format(question=turn.prompt, answer=turn.answer_text, feedback=hint)
    return {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0 if seed == 0 else temperature,
        "seed": seed,
        "max_tokens": max_tokens,
    }


# A first clause ending with a colon and a space or line break, over the model's revision (never
# over the feedback): "Here is the rewritten answer:\n..." or "Revised: ...". Not "10:30".
_PREFACE = re.compile(r"([^\n:]*):\s+(?=\S)")
_AROUND = [("```", "```"), ('"', '"'), ("\u201c", "\u201d"), ("'", "'"), ("\u2018", "\u2019")]
_AROUND += [("`", "`"), ("\u00ab", "\u00bb")]


def unwrapped(revision: str, turn: Turn) -> str:
    """The rewritten answer alone, without what the model put around it: a preface (a first
    clause ending with a colon that says nothing the question or the first answer said: "Here
    is the rewritten answer:"; "Paris: the capital" stays), and quotes, backticks or a code
    fence around the whole; taken off one at a time until none is left."""
    text = revision.strip()
    while (inner := _unwrapped_once(text, turn)) != text:
        text = inner
    return text


def _unwrapped_once(text: str, turn: Turn) -> str:
    preface = _PREFACE.match(text)
    if preface and grounded(preface.group(1), [turn.prompt, turn.answer_text]) < GROUNDED:
        return text[preface.end() :].strip()
    for opening, closing in _AROUND:
        inner = text[len(opening) : len(text) - len(closing)]
        if text.startswith(opening) and text.endswith(closing) and closing not in inner:
            return inner.strip() or text
    return text


def asking(ask: Callable[..., str]) -> Generate:
    """A `Generate` over a recipe's `ask` (`StepContext.ask`: the proposer model, which
    `learning.proposer_url` may make a stronger one than the served model), to revise and judge
    with. It samples at the request's temperature (a judge's question and the first revision
    greedily) with no seed, and its reply counts as finished: `ask` does not say whether it was
    cut short."""

    def generate(body: dict[str, Any]) -> Completion:
        text = ask(
            body["messages"],
            max_tokens=body.get("max_tokens", 400),
            temperature=body.get("temperature", 0.7),
        )
        choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return Completion(response={"choices": [choice]}, model="proposer")

    return generate


def content_judge_for(
    check: Literal["words", "proposer"], ask: Callable[..., str] | None
) -> Generate | None:
    """The model that judges whether a hindsight answer still answers, for a recipe's
    `content_check` setting: none for "words" (`answers_the_question`), the proposer model
    (`ask`) for "proposer"."""
    if check == "words":
        return None
    if ask is None:
        raise RecipeError("content_check: proposer needs the proposer model, and none was given")
    return asking(ask)


def revisions_of(
    turn: Turn,
    hint: str,
    reviser: Generate,
    count: int,
    temperature: float,
    max_tokens: int,
) -> Iterator[str]:
    """The reviser's finished rewrites of the turn's answer under `hint`, `count` asked with
    seeds 0.. (the first greedy), one at a time, each cut where it starts echoing the revision
    prompt (`before_echo`): unwrapped, then as it came (a preface that was the answer's own
    start, "Sure: a pear.", is then not lost)."""
    for seed in range(count):
        completion = reviser(revision_request(turn, hint, seed, temperature, max_tokens))
        if completion.ended_itself:  # never one cut short, or ended for looping
            text = before_echo(_text(completion))
            if text:
                yield from dict.fromkeys([unwrapped(text, turn), text])


# A line of the revision prompt's own, alone on its line ("The user's feedback on your answer:"):
# a small model that writes one goes on to copy the prompt (its first answer, the feedback),
# which would pass the content check by repeating the first answer's words.
_SCAFFOLD_LINES = [
    line.strip() for line in REVISION_PROMPT.splitlines() if line.strip() and "{" not in line
]
_ECHO = re.compile(
    r"^[ \t]*(?:" + "|".join(map(re.escape, _SCAFFOLD_LINES)) + r")[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


def before_echo(revision: str) -> str:
    """The revision up to the first line that is one of the revision prompt's own, stripped:
    "Sure! A pear.\n\nThe user's feedback on your answer:\n..." -> "Sure! A pear."; "You
    answered: 4." on a line of its own words stays."""
    echo = _ECHO.search(revision.replace("\u2019", "'"))  # the same length: a curly apostrophe
    return revision[: echo.start()].strip() if echo else revision.strip()


# -- edits: the first answer changed as feedback's form suggests, with no model -------------------

# Text the feedback asks for word for word: 'quoted' (an apostrophe inside a word, as in
# "don't", opens no quote), "quoted", or what follows a colon after a word naming a text ("end
# with the line: Cheers"; "Too long: reply briefly" is an instruction, not a text to add).
_QUOTED = re.compile(r"(?<!\w)'([^']{1,80})'(?!\w)|\"([^\"]{1,80})\"|\u201c([^\u201d]{1,80})\u201d")
_NAMES_A_TEXT = re.compile(
    r"\b(line|lines|word|words|phrase|text|sentence|greeting|signature|sign-off)\s*:\s*(.+)$",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def asked_for(hint: str) -> list[str]:
    """The texts `hint` asks to appear as they are: "Start with 'Sure!'" -> Sure!; "End with
    the line: Cheers, Reef" -> Cheers, Reef."""
    texts = [next(group for group in match.groups() if group) for match in _QUOTED.finditer(hint)]
    named = _NAMES_A_TEXT.search(hint)
    if named and len(named.group(2).strip()) <= 80:
        texts.append(named.group(2).strip())
    return list(dict.fromkeys(text.strip() for text in texts if text.strip()))


def edits(answer: str, hint: str) -> list[str]:
    """The first answer edited as feedback often asks, with no model: the answer or its first
    sentence, with each text the hint quotes before or after it, alone, or as a bullet point.
    Where the hint asks for several texts ("Start with 'Sure!' End with the line: Cheers"), one
    before and another after come first: the edit that honours all of it. Guesses: only a
    scorer can say which (if any) meets the feedback."""
    answer = answer.strip()
    if not answer:
        return []
    first = _SENTENCE_END.split(answer, maxsplit=1)[0]
    texts = asked_for(hint)
    edited = []
    for body in dict.fromkeys([answer, first]):
        edited += [f"{before} {body}\n\n{after}" for before, after in permutations(texts, 2)]
    for body in dict.fromkeys([answer, first]):
        edited += [f"{text} {body}" for text in texts]
        edited += [f"{body}\n\n{text}" for text in texts]
        edited += [body, f"- {body}"]
    return [text for text in dict.fromkeys(edited) if text != answer]


# -- relabelling ----------------------------------------------------------------------------------


def relabel(
    turns: list[Turn],
    generate: Generate,
    scorer: ScorerSpec | None,
    samples: int = 4,
    keep: int = 2,
    temperature: float = 0.8,
    max_tokens: int = 128,
    revisions: int = 2,
    reviser: Generate | None = None,
    content_judge: Generate | None = None,
    dropped: Counter[str] | None = None,
) -> list[Relabelled]:
    """Up to `keep` distinct answers per turn with feedback (`feedback_of`: its reports' words,
    else the user's next message) that still answer the question and meet the feedback: edits
    of the first answer (with a scorer), then `revisions` rewrites by `reviser` (default: the
    `generate` model), then `samples` answers of `generate` under the hint; each asked only
    while fewer than `keep` are kept. Without a scorer, the reviser judges (`follows`). Whether
    a candidate still answers is judged by words, or by `content_judge` when given (`keeps`).
    `dropped` counts each turn that taught nothing once, by reason: `CONTENT_CHECK` where an
    answer was refused by `facts_kept`, else `NOTHING_MET`; `NO_FEEDBACK_TEXT` for a turn
    nobody said anything about."""
    reviser = reviser or generate
    dropped = Counter() if dropped is None else dropped
    kept: list[Relabelled] = []
    for turn in turns:
        said = feedback_of(turn)[:1]
        if not said:
            dropped[NO_FEEDBACK_TEXT] += 1
        for hint in said:
            found = candidates(
                turn, hint, generate, reviser, scorer, samples, revisions, temperature, max_tokens
            )
            answers: set[str] = set()
            refused = False  # an answer met the feedback and was refused for its content
            for candidate in found:
                if candidate.answer in answers or candidate.answer == turn.answer_text.strip():
                    continue  # a repeat, or the very answer the feedback found wanting
                if not facts_kept(candidate.answer, turn, hint):
                    refused = True
                    continue
                if not keeps(candidate.answer, turn, hint, scorer, reviser, content_judge):
                    continue
                answers.add(candidate.answer)
                kept.append(candidate)
                if len(answers) >= keep:
                    break
            if not answers:  # a call that taught nothing counts once, for its reason
                dropped[CONTENT_CHECK if refused else NOTHING_MET] += 1
    return kept


def candidates(
    turn: Turn,
    hint: str,
    generate: Generate,
    reviser: Generate,
    scorer: ScorerSpec | None,
    samples: int,
    revisions: int,
    temperature: float,
    max_tokens: int,
) -> Iterator[Relabelled]:
    """The answers `relabel` considers for one turn, in its order, each made when asked for."""
    for answer in edits(turn.answer_text, hint) if scorer is not None else []:
        yield Relabelled(turn, hint, answer, [], "edit")
    for answer in revisions_of(turn, hint, reviser, revisions, temperature, max_tokens):
        yield Relabelled(turn, hint, answer, [], "revision")
    hinted = with_hint(turn.messages, hint)
    for sample in range(samples):
        body = {
            "messages": hinted,
            "temperature": 0.0 if sample == 0 else temperature,
            "seed": sample,
            "max_tokens": max_tokens,
        }
        completion = generate(body)
        if completion.ended_itself:  # never one cut short, or ended for looping
            token_ids = list(completion.token_ids or [])
            yield Relabelled(turn, hint, _text(completion), token_ids, "sample")


def _text(completion: Completion) -> str:
    return str(completion.response["choices"][0]["message"].get("content") or "")
