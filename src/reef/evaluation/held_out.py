"""Held out: a share of the failing calls is never learned from, so the gate judges on it.

A recipe that searches, trains on, or shows as an example the very prompts the gate then scores
it on passes its gate by remembering them: its gate cannot see that it learned nothing that
carries to the next user. So a share of a scenario's failing trajectories (`gate.held_out`: a
call or a session with a turn users scored below `gate.replay_threshold`) is kept out of every
recipe's experience, whole, chosen by the words of the prompt it opens with and the gate's seed:
every process and every step agrees, and a prompt asked twice is held out both times, never
learned from once and judged on the other. Their failing turns become the gate's `feedback`
tasks for the recipes that have a scorer to judge them (`reef.sdk.recipe.Recipe.held_out_tasks`).
Good answers are held back apart, for the gate's replay (`reef.evaluation.replay`). The gate
never asks a candidate a prompt its worked examples answer and the current release's do not
(`shown_prompts`): such a candidate is refused.

Prompts are compared by meaning, not by spelling: a prompt's key is its content words
(`reef.evaluation.content`: numbers, and words that are not function words), sorted, so "What's
the capital of France?" and "what is the capital of france" are one prompt, held out or learned
from together. Two keys are the same prompt (`same_prompt`) when their numbers are the same and
their words are near (`rapidfuzz`'s ratio at least `NEAR_RATIO`: "colour" and "color", a word
added or dropped); the leak check and the worker's drop of tasks a step learned from ask that.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from reef.evaluation.content import content_words
from reef.evaluation.tasks import EvalTask
from reef.protocol import message_text

HELD_OUT_PREFIX = "held-out:"  # the id of a gate task made from a held-out call
# What the split hashes beside the seed and the key. Named for the key by meaning (the split by
# spelling hashed "held-out"); with it, bench.learning.preferences' six training prompts fall as
# they did before (the capital of France and the sky's colour held out), so its figures compare.
SPLIT_SALT = "held-out-by-meaning"


def held_out(prompt: str, share: float, seed: int = 0) -> bool:
    """Whether a failing call asking `prompt` is kept from learning, for the gate (`share` of
    the prompts: 0 keeps none)."""
    if share <= 0:
        return False
    digest = hashlib.sha256(f"{SPLIT_SALT}:{seed}:{split_key(prompt)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


NEAR_RATIO = 90  # rapidfuzz's token-set ratio of two prompts' words at which they are one prompt
# Words that ask and say nothing of what is asked: "Name a bird, please.", "Give me a bird's
# name", "I want to know the capital of France".
REQUEST_WORDS = frozenset(
    {"please", "pls", "thanks", "thank", "kindly", "hey", "tell", "give", "want", "know",
     "wonder", "show", "need", "like"}
)
# Arithmetic's signs between numbers, as the words prompts also use: "10 - 4" asks "10 minus 4".
_SIGNS = [(re.compile(rf"(?<=\d)\s*(?:{sign})\s*(?=\d)"), f" {word} ") for sign, word in
          ((r"\+", "plus"), ("-", "minus"), (r"\*|x|\u00d7", "times"), ("/|\u00f7", "divided"))]


def prompt_key(text: str) -> str:
    """A prompt as the leak check compares it: its content words, sorted, numbers as digits
    ("ten" is 10) and signs as words ("10 - 4" is "10 minus 4"), without the words that only
    ask (its words, lower-cased, for a prompt with none: "Hi")."""
    return _key(text, signs=True)


def _key(text: str, signs: bool) -> str:
    from text_to_num import alpha2digit

    read = alpha2digit(text, "en")
    for sign, word in _SIGNS if signs else ():
        read = sign.sub(word, read)
    words = content_words(read) - REQUEST_WORDS
    return " ".join(sorted(words)) if words else " ".join(text.lower().split())


def split_key(text: str) -> str:
    """What the split hashes: the prompt's key with each word's spelling worn down to its
    consonants ("colour" and "color" are "clr", "grey" and "gray" "gr"), so that near spellings
    of one prompt fall on one side; a few other words collide too, which only keeps them
    together."""
    # Signs stay signs here: a question's "2+2" and its "2 plus 2" may fall apart, which the
    # leak check (`prompt_key`, signs read as words) still catches.
    return " ".join(sorted(_skeleton(word) for word in _key(text, signs=False).split()))


def _skeleton(word: str) -> str:
    if word.isdigit():
        return word
    worn = word[0] + re.sub(r"[aeiouy]", "", word[1:])
    return re.sub(r"(.)\1+", r"\1", worn)


def same_prompt(key: str, other: str) -> bool:
    """Whether two prompt keys ask the same: the same numbers, and near words, one prompt's
    words all in the other's counting as near ("capital city france" asks "capital france")."""
    from rapidfuzz import fuzz

    if key == other:
        return True
    numbers = [{w for w in k.split() if w.isdigit()} for k in (key, other)]
    if numbers[0] != numbers[1]:
        return False
    words = [" ".join(w for w in k.split() if not w.isdigit()) for k in (key, other)]
    return bool(words[0] and words[1]) and fuzz.token_set_ratio(*words) >= NEAR_RATIO


def among(key: str, keys: Iterable[str]) -> bool:
    """Whether `key` asks what one of `keys` asks."""
    return any(same_prompt(key, other) for other in keys)


def task_prompt(task: EvalTask) -> str:
    """The last user message of a chat task: what it asks."""
    for message in reversed(task.messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def shown_prompts(examples: Iterable[tuple[str, str]]) -> set[str]:
    """The prompts (`prompt_key`) worked examples, (user, assistant) pairs, answer."""
    return {prompt_key(user) for user, _ in examples}


def leaked(tasks: list[EvalTask], shown: set[str]) -> list[EvalTask]:
    """The tasks whose prompt the examples `shown` answer, or a rephrasing of it."""
    return [task for task in tasks if shown and among(prompt_key(task_prompt(task)), shown)]
