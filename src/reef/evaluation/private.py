"""Private data in text: what must never cross from one user's calls into what serves another.

A harness release serves its worked examples to every user of its scenario, and a LoRA release
carries what it trained on in its weights; so a record whose prompt, answer or feedback holds
private data is kept out of learning whole (`reef.sdk.view`), and a tree a learner proposes is
refused if any of its files holds some (`reef.releases.workflow.propose`). A name beside private
data goes with it: the whole record is kept out, not the number alone.

What is found, each by the field's own tools where one exists:

- **card numbers**: 13 to 19 digits (spaces or dashes between) that pass the Luhn check, as a
  card issuer's do (the algorithm, ISO/IEC 7812), and 16 digits written as a card is, in four
  groups of four, whatever their check digit (a made-up number still reads as one);
- **IBANs**: validated by `schwifty` (country format and check digits);
- **phone numbers**: found by `phonenumbers` (Google's libphonenumber), valid numbers only, in
  international form or as a US number, written as a number is dialled (a `+`, or groups apart:
  a bare run of ten digits is as often a count or a timestamp);
- **emails**: an address's shape;
- **API keys and tokens**: `detect-secrets`' detectors of known formats (AWS, GitHub, GitLab,
  Slack, Stripe, JWT, private keys, …), the model providers' prefixed keys (`sk-…`, `hf_…`), and
  a value said to be a password, PIN, key or token, in the few words after its name ("password
  is hunter2!", "pw: …", "the password for the wifi is …", "my pin is 1234"), a word with a
  digit and none of code's brackets: not `token = int(key)`, "the password is correct" or
  "token limit: 4096". A random-looking
  word alone is not enough (detect-secrets' high-entropy plugins read only quoted values in code
  for that reason): agents' calls are full of commit hashes, ids and paths, and dropping them all
  would leave nothing to learn from.

Why not Presidio or scrubadub: their names and addresses need a spaCy or Stanford NER model,
which a Reef install cannot download; the card, IBAN, phone and key detectors above are what
they run for those kinds too. `detect-secrets`' public-IP detector is left out: an address such
as 8.8.8.8 is a fact, not a user's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
CARD_GROUPS = re.compile(r"(?<![\d-])\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?![\d-])")
EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
IBAN_SHAPE = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
# A value said to be a secret: within a few words after one of these, a word that is one by its
# shape (`_secretlike`): "my password is hunter2!", "password: hunter2!", "pw = Sup3rS3cret",
# "the password for the wifi is Blue42Cat", "my pin is 1234", "use the token abc123XYZ789".
# Not `password: str`, `token = int(key)`, "the password is correct", "token limit: 4096".
SECRET_WORD = re.compile(
    r"(?i)\b(?:password|passwd|passcode|passphrase|pw|pin|api[ _-]?key|secret(?:[ _-]?key)?"
    r"|access[ _-]?(?:key|token)|auth[ _-]?token|token)\b"
)
_AFTER_SECRET_WORD = re.compile(r"[^\s]+")
SAID_WITHIN = 6  # words after the secret's name that may say it
CONNECTORS = frozenset({"is", ":", "=", "was", "be"})
SHORT_SECRETS = ("pin", "passcode")  # four digits are enough for these
# A line a known key format could be on: most lines of text and code are not, and skip the
# detectors (25 regular expressions each).
KEYISH = re.compile(r"[A-Za-z0-9_\-+/=.]{16,}|PRIVATE KEY|(?i:key|token|secret|password)")
# Model providers' keys, which detect-secrets does not know in their current forms.
PREFIXED_KEY = re.compile(r"\b(?:sk-(?:proj-|ant-)?|hf_)[A-Za-z0-9_-]{20,}")
# What every finding needs somewhere in the text: most text has none, and is read in microseconds.
WORTH_READING = re.compile(
    r"(?:\d[ ()+.-]{0,2}){7,}|@|\S{20,}|(?i:password|passwd|passcode|passphrase|\bpw\b|\bpin\b"
    r"|secret|token|api.?key|access.?key|private key)"
)
PHONE_REGION = "US"  # where a number written without its country code is read from
LEFT_OUT_DETECTORS = {"IPPublicDetector"}


@dataclass(frozen=True)
class Finding:
    kind: str  # card, iban, phone, email, secret
    value: str

    @property
    def masked(self) -> str:
        """What a message may say of it: its kind and last characters only."""
        return f"{self.kind} …{self.value[-2:]}"


def private_data(text: str) -> list[Finding]:
    """Every piece of private data found in `text`."""
    if not text or not WORTH_READING.search(text):
        return []
    return [*_cards(text), *_ibans(text), *_phones(text), *_emails(text), *_secrets(text)]


def first_private(values: Any) -> Finding | None:
    """The first private data found in `values`: a string, or any JSON value (messages, an
    answer, a report's feedback), every string in it read."""
    for text in _strings(values):
        found = private_data(text)
        if found:
            return found[0]
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def luhn(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _cards(text: str) -> Iterator[Finding]:
    for match in CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group())
        grouped = CARD_GROUPS.fullmatch(match.group().strip()) is not None
        if 13 <= len(digits) <= 19 and (luhn(digits) or grouped) and len(set(digits)) > 1:
            yield Finding("card", digits)


def _ibans(text: str) -> Iterator[Finding]:
    from schwifty import IBAN

    for match in IBAN_SHAPE.finditer(text):
        try:
            IBAN(match.group())
        except ValueError:
            continue
        yield Finding("iban", match.group())


def _phones(text: str) -> Iterator[Finding]:
    import phonenumbers

    if sum(char.isdigit() for char in text) < 7:
        return
    for match in phonenumbers.PhoneNumberMatcher(
        text, PHONE_REGION, leniency=phonenumbers.Leniency.VALID
    ):
        raw = match.raw_string
        if raw.startswith("+") or not raw.isdigit():
            yield Finding("phone", raw)


def _emails(text: str) -> Iterator[Finding]:
    for match in EMAIL.finditer(text):
        yield Finding("email", match.group())


def _secrets(text: str) -> Iterator[Finding]:
    for line in text.splitlines():
        if not KEYISH.search(line):
            continue
        for plugin in _key_detectors():
            for value in plugin.analyze_string(line):
                yield Finding("secret", str(value))
    for match in SECRET_WORD.finditer(text):
        found = _said_after(text[match.end() : match.end() + 200], match.group().lower())
        if found is not None:
            yield Finding("secret", found)
    for match in PREFIXED_KEY.finditer(text):
        yield Finding("secret", match.group())


def _said_after(rest: str, name: str) -> str | None:
    """The secret said in the few words after its `name`, or None: a word after `is`, `:` or
    `=` that has a digit and no code's brackets (four characters for a PIN, six else), or, with
    nothing between, a word of eight or more letters and digits."""
    connected = False
    for word in _AFTER_SECRET_WORD.findall(rest)[:SAID_WITHIN]:
        if word.lower().rstrip(":=") in CONNECTORS or word in (":", "="):
            connected = True
            continue
        if word[0] in ":=" or word[-1] in ":=":  # "pw:", "=Sup3rS3cret": the sign in the word
            connected = True
            word = word.strip(":=")
            if not word:
                continue
        value = word.strip("\"'`.,;!?")  # quotes around it, the sentence's end after it
        value = word.strip("\"'`,;") if any(c.isdigit() for c in value) else value
        if _secretlike(value, 4 if name in SHORT_SECRETS else 6 if connected else 8):
            return value
    return None


def _secretlike(word: str, shortest: int) -> bool:
    """A word that could be a password or key: long enough, a digit in it, none of a code
    expression's brackets or calls."""
    return (
        len(word) >= shortest
        and any(c.isdigit() for c in word)
        and not any(c in word for c in "()[]{}<>")
    )


@functools.cache
def _key_detectors() -> list[Any]:
    """detect-secrets' detectors of known key formats (its high-entropy plugins read every word
    of free text as a candidate, and are left out)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin

    detectors = []
    plugin: Any
    for plugin in get_mapping_from_secret_type_to_class().values():
        if issubclass(plugin, HighEntropyStringsPlugin) or plugin.__name__ in LEFT_OUT_DETECTORS:
            continue
        detectors.append(plugin())
    return detectors

