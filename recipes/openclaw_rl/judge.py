"""The judge: what the next state says about a turn, as a score in {+1, -1, 0} and maybe a hint.

OpenClaw-RL learns from the conversation itself: the user's next message ("no, shorter") or
the tool's result (an error) says whether the answer helped. A judge reads the turn's request,
its answer and that next state, and votes `m` times:

- the score is the majority of the votes; a tie (no strict majority) is 0;
- the hint is what the next state says should have been done, a judgement of its own as in
  OpenClaw-RL's hindsight distillation: of the votes that give a hint, whatever their score, the
  longest hint longer than 10 characters (a shorter one says too little: "none", "N/A"); no
  hint when none is.

Two judges:

- `ModelJudge`: an OpenAI-compatible model (the served model by default, or `judge_url`), its
  reply constrained to `{"score": -1|0|1, "hint": "..."}` by a JSON schema, with room to close;
- `KeywordJudge`: no model, for a served model too small to judge (the embedded 135M one): a
  next user message that corrects ("no", "I said", "wrong", "shorter"…) is -1 with that message
  as its hint, one that approves ("thanks", "great"…) is +1, a tool result that reports an
  error is -1; anything else 0. It votes once.

An explicit score from `/reef/report` overrides any judge: 2 * score - 1, so 1 is +1 and 0 is -1.
The report's words, when it has some (feedback text, or `{"hint"|"text": ...}`), are the hint:
the newest, as the user wrote it, with no length rule.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from reef.sdk import Turn, hints, message_text

# Sends chat messages to a model and returns its reply; with a JSON schema, constrained to it.
Ask = Callable[..., str]

HINT_MIN_CHARS = 10  # a judge's hint must be longer than this to count (OpenClaw-RL's rule)
HINT_MAX_CHARS = 240  # bounded, so that a reply held to the schema closes within VOTE_ROOM
VOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "integer", "enum": [-1, 0, 1]},
        "hint": {"type": "string", "maxLength": HINT_MAX_CHARS},
    },
    "required": ["score", "hint"],
    "additionalProperties": False,
}
# max_tokens for the longest vote the schema allows, with room for the spaces the grammar
# allows: a reply cut short is not JSON. `maxLength` counts code points, and a byte-level
# tokenizer may spend a token on each of a code point's UTF-8 bytes (up to 4): a hint of emoji
# took four times the room of a hint of letters, and was cut.
TOKENS_PER_CODE_POINT = 4
VOTE_ROOM = len(json.dumps({"score": -1, "hint": ""})) + TOKENS_PER_CODE_POINT * HINT_MAX_CHARS + 64
JUDGE_PROMPT = """You judge one answer of an AI assistant by what happened next.

The conversation so far:
{context}

The assistant answered:
{answer}

What came next (the user's reply or a tool's result):
{next_state}

Did the answer serve the user? Score 1 if what came next shows it did, -1 if what came next \
shows it did not (a correction, a complaint, an error), 0 if you cannot tell. If what came next \
says what the assistant should have done instead, put that in "hint" as a short instruction; \
otherwise leave "hint" empty. Reply with JSON: {{"score": ..., "hint": "..."}}"""


@dataclass
class Vote:
    score: int  # +1, -1 or 0
    hint: str = ""


@dataclass
class Judgement:
    """What a turn is trained with, and why: recorded per turn and shown by `reef records`."""

    score: float  # the advantage of binary RL, in [-1, 1]
    judge: str  # the judge's name, or "report" (the user's explicit score)
    votes: list[Vote] = field(default_factory=list)
    hint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "votes": [asdict(vote) for vote in self.votes]}


class Judge(Protocol):
    name: str

    def votes(self, turn: Turn) -> list[Vote]: ...


def judge_turn(turn: Turn, judge: Judge) -> Judgement | None:
    """The turn's judgement: the user's score when there is one, else the judge's votes on its
    next state; None for a turn with neither (a session's last turn: nothing to learn from)."""
    if turn.score is not None:
        return reported(turn, turn.score)
    if not turn.next_state:
        return None
    votes = judge.votes(turn)
    score = majority([vote.score for vote in votes])
    return Judgement(score=score, judge=judge.name, votes=votes, hint=longest_hint(votes))


def reported(turn: Turn, score: float) -> Judgement:
    """The user's own judgement: their score as an advantage, their newest words as the hint."""
    words = hints(turn)
    advantage = max(-1.0, min(1.0, 2.0 * score - 1.0))
    return Judgement(score=advantage, judge="report", hint=words[-1] if words else None)


def majority(scores: list[int]) -> int:
    """The score more than half of the votes gave; 0 when none has a strict majority."""
    if not scores:
        return 0
    value, count = Counter(scores).most_common(1)[0]
    return value if count * 2 > len(scores) else 0


def longest_hint(votes: list[Vote]) -> str | None:
    """The longest hint of more than HINT_MIN_CHARS characters, whatever its vote's score (the
    first on ties); None when no vote gives one."""
    found = [vote.hint.strip() for vote in votes if len(vote.hint.strip()) > HINT_MIN_CHARS]
    return max(found, key=len) if found else None


# -- judges ---------------------------------------------------------------------------------------


class ModelJudge:
    """`m` votes of a model, each a JSON reply to `JUDGE_PROMPT`."""

    name = "model"

    def __init__(self, ask: Ask, votes: int = 3) -> None:
        self.ask = ask
        self.count = votes

    def votes(self, turn: Turn) -> list[Vote]:
        messages = [{"role": "user", "content": judge_prompt(turn)}]
        return [self._vote(messages) for _ in range(self.count)]

    def _vote(self, messages: list[dict[str, Any]]) -> Vote:
        return parse_vote(self.ask(messages, json_schema=VOTE_SCHEMA, max_tokens=VOTE_ROOM))


def judge_prompt(turn: Turn) -> str:
    return JUDGE_PROMPT.format(
        context=_transcript(turn.messages),
        answer=turn.answer_text or "(no text)",
        next_state=_transcript(turn.next_state or []),
    )


def parse_vote(reply: str) -> Vote:
    """A vote from the judge's JSON reply; a reply that is not one is an abstention (0)."""
    try:
        data = json.loads(reply)
        score = int(data.get("score", 0))
    except (ValueError, TypeError, AttributeError):
        return Vote(0)
    hint = data.get("hint")
    return Vote(score if score in (-1, 0, 1) else 0, hint if isinstance(hint, str) else "")


def endpoint_ask(url: str, model: str | None, api_key_env: str | None) -> Ask:
    """Ask an OpenAI-compatible endpoint (`judge_url`) instead of the served model."""

    def ask(
        messages: list[dict[str, Any]],
        json_schema: dict[str, Any] | None = None,
        max_tokens: int = 200,
    ) -> str:
        body: dict[str, Any] = {
            "model": model or "judge",
            "messages": messages,
            "temperature": 0.7,
            "max_tokens": max_tokens,
        }
        if json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "vote", "schema": json_schema, "strict": True},
            }
        headers = {"x-reef-capture": "false"}  # a Reef judge does not record its verdicts
        if api_key_env and os.environ.get(api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        response = httpx.post(
            f"{url.rstrip('/')}/chat/completions", json=body, headers=headers, timeout=300
        )
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"].get("content") or "")

    return ask


CORRECTION = re.compile(
    r"^\s*(no\b(?!\s+(problem|worries))|nope\b|not\b|wrong\b)|"
    r"\b(i said|i asked|i meant|that's not|that is not|"
    r"instead|shorter|longer|too long|too short|don't|do not|stop)\b",
    re.IGNORECASE,
)
APPROVAL = re.compile(
    r"\b(thanks|thank you|great|perfect|exactly|correct|nice|good job)\b", re.IGNORECASE
)
TOOL_ERROR = re.compile(r"\b(error|exception|traceback|failed|not found)\b", re.IGNORECASE)


class KeywordJudge:
    """One vote read off the next state's words (see the module's docstring)."""

    name = "keywords"

    def votes(self, turn: Turn) -> list[Vote]:
        for message in turn.next_state or []:
            text = message_text(message.get("content")).strip()
            if message.get("role") == "user":
                if CORRECTION.search(text):
                    return [Vote(-1, text)]
                return [Vote(1 if APPROVAL.search(text) else 0)]
            if message.get("role") == "tool" and TOOL_ERROR.search(text):
                return [Vote(-1, text)]
        return [Vote(0)]


def _transcript(messages: list[dict[str, Any]]) -> str:
    lines = [f"{m.get('role', '?')}: {message_text(m.get('content'))}" for m in messages]
    return "\n".join(lines) or "(nothing)"
