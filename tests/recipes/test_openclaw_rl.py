"""openclaw_rl: the judge's votes and the token advantages against hand computations, and the
recipe through the whole loop on the embedded model with a user who only says what it wants in
its next message."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from reef.recipes.openclaw_rl.judge import (
    VOTE_SCHEMA,
    KeywordJudge,
    ModelJudge,
    Vote,
    endpoint_ask,
    judge_turn,
    majority,
    parse_vote,
)
from reef.recipes.openclaw_rl.recipe import OpenClawRLSettings, served_logprobs, token_advantages
from reef.sdk.view import Turn
from reef.testing import scripted_user
from reef.testing.processes import ServerProcess, free_port, reef_serve


def turn(
    next_message: str | None = None,
    score: float | None = None,
    role: str = "user",
    reports: list[dict[str, Any]] | None = None,
) -> Turn:
    if reports is None:
        reports = [{"score": score}] if score is not None else []
    return Turn(
        record_id="rec_1",
        messages=[{"role": "user", "content": "Name a bird."}],
        answer={"role": "assistant", "content": "The bird I would name is a robin, which..."},
        release_id="default@0",
        reports=reports,
        next_state=[{"role": role, "content": next_message}] if next_message else None,
    )


class Votes:
    """A judge that votes what it is told: the aggregation is what these tests check."""

    name = "listed"

    def __init__(self, *votes: Vote) -> None:
        self.listed = list(votes)

    def votes(self, turn: Turn) -> list[Vote]:
        return self.listed


def test_the_majority_needs_more_than_half_of_the_votes_and_a_tie_is_zero() -> None:
    assert majority([-1, -1, 1]) == -1
    assert majority([1, 1, 0, -1]) == 0  # 2 of 4 is not a strict majority
    assert majority([1, -1]) == 0
    assert majority([0, 0, 1]) == 0
    assert majority([]) == 0


def test_a_correction_whose_votes_split_still_gives_its_hint() -> None:
    split = Votes(Vote(-1, "be shorter, one line"), Vote(0), Vote(0))
    judged = judge_turn(turn("No, shorter."), split)
    assert judged is not None
    assert (judged.score, judged.hint) == (0, "be shorter, one line")


def test_the_hint_is_the_longest_over_ten_characters_whatever_its_vote_says() -> None:
    votes = Votes(
        Vote(-1, "keep it short"),
        Vote(1, "  answer in one short line  "),
        Vote(-1, "be brief, please"),
    )
    judged = judge_turn(turn("No, shorter."), votes)
    assert judged is not None
    assert (judged.score, judged.hint) == (-1, "answer in one short line")
    tied = Votes(Vote(-1, "say it in one line"), Vote(-1, "one line, no more!"))
    assert judge_turn(turn("No."), tied).hint == "say it in one line"  # type: ignore[union-attr]


def test_a_hint_of_ten_characters_or_fewer_is_no_hint() -> None:
    ten = "be brief!!"
    assert len(ten) == 10
    votes = Votes(Vote(-1, ten), Vote(-1, ten), Vote(-1, "   shorter.   "))
    judged = judge_turn(turn("No, shorter."), votes)
    assert judged is not None
    assert (judged.score, judged.hint) == (-1, None)
    eleven = Votes(Vote(-1, ten + "!"), Vote(-1, ten))
    assert judge_turn(turn("No."), eleven).hint == ten + "!"  # type: ignore[union-attr]


def test_a_reported_score_with_words_gives_the_words_as_the_hint() -> None:
    judge = Votes(Vote(1, "the judge is not asked when the user scored"))
    worded = turn("No.", reports=[{"score": 0.0, "feedback": "Answer in one word."}])
    judged = judge_turn(worded, judge)
    assert judged is not None
    assert (judged.score, judged.judge, judged.hint) == (-1.0, "report", "Answer in one word.")
    # The newest words, as stored ({"text": ...} too), with no length rule: the user wrote them.
    reports = [
        {"score": 0.0, "feedback": "Too long."},
        {"score": 0.0, "feedback": {"text": "Shorter"}},
    ]
    assert judge_turn(turn(reports=reports), judge).hint == "Shorter"  # type: ignore[union-attr]
    assert judge_turn(turn(score=0.0), judge).hint is None  # type: ignore[union-attr]


def test_the_model_judge_leaves_room_for_the_longest_reply_its_schema_allows(
    peer: ServerProcess,
) -> None:
    reply = '{"score": 0, "hint": "answer in one line"}'
    judge = ModelJudge(endpoint_ask(f"{peer.url}/v1", f"reply:{reply}", None), votes=1)
    assert judge.votes(turn("Hm.")) == [Vote(0, "answer in one line")]
    sent = httpx.get(f"{peer.url}/peer/last").json()["body"]
    schema = sent["response_format"]["json_schema"]["schema"]
    assert schema == VOTE_SCHEMA
    # A reply cut short by max_tokens is not JSON: room for the longest, at a token a character.
    longest = {"score": -1, "hint": "x" * schema["properties"]["hint"]["maxLength"]}
    assert len(json.dumps(longest)) <= sent["max_tokens"]


def test_a_reply_that_is_not_a_vote_abstains() -> None:
    assert parse_vote('{"score": -1, "hint": "shorter"}') == Vote(-1, "shorter")
    assert parse_vote('{"score": 7, "hint": 3}') == Vote(0, "")
    assert parse_vote("I think it was fine") == Vote(0, "")


def test_an_explicit_score_overrides_the_judge_and_a_last_turn_is_not_judged() -> None:
    judge = Votes(Vote(1), Vote(1), Vote(1))
    reported = judge_turn(turn("No, shorter.", score=0.0), judge)
    assert reported is not None and (reported.score, reported.judge) == (-1.0, "report")
    assert judge_turn(turn(score=1.0), judge).score == 1.0  # type: ignore[union-attr]
    assert judge_turn(turn(score=0.75), judge).score == 0.5  # type: ignore[union-attr]
    assert judge_turn(turn(), judge) is None  # no next state, no score: masked
    hint = "answer in a few words"
    judged = judge_turn(turn("No, shorter."), Votes(Vote(-1, hint), Vote(0), Vote(-1, hint)))
    assert judged is not None
    assert (judged.score, judged.hint, judged.judge) == (-1, hint, "listed")


def test_the_keyword_judge_reads_corrections_approvals_and_tool_errors() -> None:
    judge = KeywordJudge()
    assert judge.votes(turn(scripted_user.CORRECTION)) == [Vote(-1, scripted_user.CORRECTION)]
    assert judge.votes(turn("I said in French")) == [Vote(-1, "I said in French")]
    assert judge.votes(turn(scripted_user.APPROVAL)) == [Vote(1)]
    assert judge.votes(turn("No problem, thanks!")) == [Vote(1)]
    assert judge.votes(turn("That's not what I asked.")) == [Vote(-1, "That's not what I asked.")]
    assert judge.votes(turn("And a fish?")) == [Vote(0)]
    assert judge.votes(turn("Error: file not found", role="tool"))[0].score == -1


def test_the_policy_examples_carry_the_log_probs_the_engine_served() -> None:
    served = Turn(
        record_id="rec_1",
        messages=[{"role": "user", "content": "Hi"}],
        answer={},
        release_id="base",
        completion_token_ids=[5, 6, 7],
        completion_logprobs=[-0.1, -0.2, -0.3],
    )
    assert served_logprobs(served, 3) == [-0.1, -0.2, -0.3]
    assert served_logprobs(served, 2) == [-0.1, -0.2]  # the answer cut to the training length
    unknown = dataclasses.replace(served, completion_logprobs=None)
    assert served_logprobs(unknown, 3) is None  # the correction is then off for it
    partial = dataclasses.replace(served, completion_logprobs=[-0.1])
    assert served_logprobs(partial, 3) is None


def test_token_advantages_add_the_distillation_term_to_the_score() -> None:
    settings = OpenClawRLSettings(w_rl=1.0, w_opd=0.5)
    assert token_advantages(-1.0, 3, settings) == [-1.0, -1.0, -1.0]
    teacher = [-1.0, -2.0, -0.25]
    student = [-1.5, -1.0, -0.25]
    # -1 + 0.5 * (-1.0 + 1.5), -1 + 0.5 * (-2.0 + 1.0), -1 + 0
    assert token_advantages(-1.0, 3, settings, teacher, student) == pytest.approx(
        [-0.75, -1.5, -1.0]
    )
    only_distillation = OpenClawRLSettings(w_rl=0.0, w_opd=1.0)
    assert token_advantages(1.0, 3, only_distillation, teacher, student) == pytest.approx(
        [0.5, -1.0, 0.0]
    )


CONFIG = """
engine:
  llamacpp: {n_ctx: 1024, n_threads: 2}
gate:
  policy: floor
  floor: 0.0
  max_tokens: 24
learning:
  recipe: openclaw_rl
  judge: keywords
  interval_s: 0.5
  batch_size: 6
  steps: 2
  learning_rate: 0.0005
  revisions: 0  # hindsight rewrites: tests/learning/test_revision.py
"""


@pytest.mark.e2e
def test_next_messages_alone_train_a_released_lora_and_the_judgements_are_recorded(
    tmp_path: Path,
) -> None:
    (tmp_path / "reef.yaml").write_text(CONFIG)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(
        scripted_user.eval_tasks(scripted_user.EVALS[:2], scripted_user.SHORT_PATTERN)
    )
    server = reef_serve(tmp_path, free_port())
    with server.start():
        replies = [
            scripted_user.converse(server.url, prompt, session=f"s{number}")[1]
            for number, prompt in enumerate(scripted_user.TRAINING)
        ]
        release = wait_for_release(server)
        records = httpx.get(f"{server.url}/reef/records", params={"limit": 100}).json()["data"]
        candidates = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
        shown = subprocess.run(
            [sys.executable, "-m", "reef", "records", "--url", server.url, "--limit", "50"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "400"},
        ).stdout
        judge_replies = model_judge_replies(server.url, records)
    assert release["kind"] == "lora"
    released = next(c for c in candidates if c["state"] == "released")
    assert released["metrics"]["judged"] == 6
    assert len(released["metrics"]["loss"]) == 2

    first_turns = [r for r in records if len(r["request"]["messages"]) == 1]
    last_turns = [r for r in records if len(r["request"]["messages"]) == 3]
    assert len(first_turns) == len(last_turns) == 6
    for record in first_turns:
        (annotation,) = record["annotations"]
        reply = replies[int(record["session"][1:])]
        assert annotation["source"] == "openclaw_rl" and annotation["judge"] == "keywords"
        expected = -1 if reply == scripted_user.CORRECTION else 1
        assert annotation["score"] == expected
        assert annotation["votes"] == [{"score": expected, "hint": reply if expected == -1 else ""}]
        assert annotation["hint"] == (reply if expected == -1 else None)
    # A session's last turn has no next state: nothing was concluded about it.
    assert all(record["annotations"] == [] for record in last_turns)
    assert "openclaw_rl:" in shown and "by keywords" in shown
    # The served model as judge: each raw reply, before parsing, is held to the schema sent.
    assert len(judge_replies) == 3
    for reply, schema in judge_replies:
        assert schema is not None
        jsonschema.validate(json.loads(reply), schema)


def wait_for_release(server) -> dict:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while True:
        status = httpx.get(f"{server.url}/reef/status").json()
        if status["serving"].get("default", "base") != "base":
            return httpx.get(f"{server.url}/reef/scenarios/default/releases").json()["data"][0]
        last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
        assert last.get("outcome") not in ("rejected", "error", "no proposal"), (
            last,
            server.log()[-3000:],
        )
        assert time.monotonic() - started < 600, server.log()[-3000:]
        time.sleep(0.5)


class RecordedAsk:
    """An ask that keeps each raw reply (what the model returned) with the schema it was sent."""

    def __init__(self, ask: Callable[..., str]) -> None:
        self.ask = ask
        self.replies: list[tuple[str, dict[str, Any] | None]] = []

    def __call__(
        self,
        messages: list[dict[str, Any]],
        json_schema: dict[str, Any] | None = None,
        **options: Any,
    ) -> str:
        reply = self.ask(messages, json_schema=json_schema, **options)
        self.replies.append((reply, json_schema))
        return reply


def model_judge_replies(url: str, records: list[dict]) -> list[tuple[str, dict[str, Any] | None]]:
    """The raw replies of three votes of the served model judging the first recorded turn from
    its next state, each with the schema it was sent."""
    first = next(r for r in records if len(r["request"]["messages"]) == 1)
    later = next(r for r in records if r["session"] == first["session"] and r is not first)
    judged = Turn(
        record_id=first["id"],
        messages=first["request"]["messages"],
        answer=first["response"]["choices"][0]["message"],
        release_id=first["release_id"],
        next_state=later["request"]["messages"][2:],
    )
    ask = RecordedAsk(endpoint_ask(f"{url}/v1", None, None))
    ModelJudge(ask, votes=3).votes(judged)
    return ask.replies


def test_the_judge_settings_refuse_unknown_judges() -> None:
    with pytest.raises(ValueError, match="judge"):
        OpenClawRLSettings.model_validate({"judge": "oracle"})
    assert json.loads(OpenClawRLSettings().model_dump_json())["votes"] == 3
