"""What an answer says, as a bag of content words, and whether another answer still says it.

Learning a preference must not cost the agent its substance: "Sure! Paris." keeps what "Paris is
the capital of France." said, "Sure! Sure!" keeps nothing. These checks compare the content words
of two texts (words of two letters or more that are not function words, and every number), with
no model involved, so they hold whatever the model samples:

- `kept(reference, answer, question)`: the share of what the reference said beyond the question
  that the answer still says (the `reference` scorer: a held-back good answer replayed in the
  gate);
- `grounded(answer, sources)`: the share of the answer's content words found in the sources (a
  hindsight answer must say what the question, the original answer or the feedback said, not
  something new, and not only the preference).
"""

from __future__ import annotations

import re

# Lower-case runs of letters (any script) or digits: "6+3=9" -> 6, 3, 9; "l'été" -> l, été.
_WORDS = re.compile(r"[^\W\d_]+|\d+")
_FUNCTION_WORDS_TEXT = """
the and for are but not you all any can had her was one our out has his how its may new now
old see two way who did get let put say she too use that with have this will your from they
been were what when where which while would there their them then than into just like some
more most also very only such here each both much many other over under about after again
against because before being below between could does doing down during few further having off
once same should those through until upon why yours itself myself these is it of to in on at
by or as be an we he me my do no if up so us am
"""
_FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())


def content_words(text: str) -> set[str]:
    """The words that carry what `text` says: numbers, and words of two letters or more that
    are not English function words."""
    words = (word.lower() for word in _WORDS.findall(text))
    return {w for w in words if w.isdigit() or (len(w) >= 2 and w not in _FUNCTION_WORDS)}


def kept(reference: str, answer: str, question: str = "") -> float:
    """The share of what `reference` says that `answer` says too: its content words beyond the
    `question`'s ("Paris" of "The capital of France is Paris."), or all of them where it adds
    none; 1.0 for a reference with no content words."""
    said = content_words(reference)
    wanted = (said - content_words(question)) or said
    if not wanted:
        return 1.0
    return len(wanted & content_words(answer)) / len(wanted)


def grounded(answer: str, sources: list[str]) -> float:
    """The share of `answer`'s content words found in `sources` (0.0 for an answer with none:
    an answer that says nothing is not grounded)."""
    said = content_words(answer)
    if not said:
        return 0.0
    known = set().union(*(content_words(source) for source in sources))
    return len(said & known) / len(said)
