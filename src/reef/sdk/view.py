"""The experience a recipe sees: trajectories built from records, fresh and not yet consumed.

Every recipe gets the same processing:

- **sessions**: calls that share an `x-reef-session`, or whose messages extend an earlier call's
  messages and answer, are one trajectory; feedback on any call stays on that turn;
- **next state**: each turn knows what came after it in its trajectory (the next user message
  or tool results), the signal OpenClaw-style recipes learn from;
- **deduplication**: identical retries (same scenario, session and request) count once, with
  the feedback of every copy; identical turns of different sessions stay apart;
- **consumption**: a record a candidate was built from is never offered again (persisted);
- **staleness**: with `max_staleness: N`, records served more than N releases before the
  current head are skipped and counted;
- **held back**: one in four good answers (see `evaluation.replay`) is kept out of learning, so
  that the gate can ask a candidate those questions again;
- **held out**: a share of the trajectories users scored low, by the prompt they open with
  (`gate.held_out`, see `evaluation.held_out`), is kept out of learning too, whole: their failing
  turns are in `held_out`, and the gate judges a recipe's candidates on them, prompts it never
  saw;
- **private**: a call whose request, answer or reports (feedback, a demonstration, a teacher's
  answer) hold private data (a card number, an IBAN, a phone number, an email, a key or
  password: `evaluation.private`) is kept out of learning and out of the gate, whole, and
  counted: what one user sent never reaches another user's answers through a release.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reef.evaluation.held_out import held_out
from reef.evaluation.private import first_private
from reef.evaluation.replay import good, held_back, trains
from reef.protocol import message_text
from reef.store import ExperienceStore

PAGE = 1000


@dataclass
class Turn:
    record_id: str
    messages: list[dict[str, Any]]
    answer: dict[str, Any]
    release_id: str
    reports: list[dict[str, Any]] = field(default_factory=list)
    next_state: list[dict[str, Any]] | None = None  # what the next call added, if any
    # What the model read and produced, token by token, where the engine captured it: the
    # prompt after the harness and chat template, the sampled ids and their serving logprobs.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    # The tools the call offered (the request's `tools`), which the chat template renders.
    tools: list[dict[str, Any]] | None = None

    @property
    def score(self) -> float | None:
        scores = [r["score"] for r in self.reports if r.get("score") is not None]
        return statistics.fmean(scores) if scores else None

    @property
    def feedback(self) -> list[Any]:
        return [r["feedback"] for r in self.reports if r.get("feedback") is not None]

    @property
    def prompt(self) -> str:
        """The last user message's text."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message_text(message.get("content"))
        return ""

    @property
    def answer_text(self) -> str:
        return message_text(self.answer.get("content"))


@dataclass
class Trajectory:
    id: str
    turns: list[Turn]

    @property
    def record_ids(self) -> list[str]:
        return [turn.record_id for turn in self.turns]


@dataclass
class ExperienceCounts:
    waiting: int = 0
    consumed: int = 0
    stale_skipped: int = 0
    held_back: int = 0
    held_out: int = 0
    private: int = 0  # calls kept out whole: private data in the request, answer or reports


class ExperienceView:
    """A read-only view of one scenario's usable experience, computed once when built."""

    def __init__(
        self,
        store: ExperienceStore,
        scenario: str,
        consumed: set[str],
        head_number: int = 0,
        max_staleness: int | None = None,
        hold_back_at: float | None = None,
        hold_back: bool = True,
        hold_out: float = 0.0,
        hold_out_seed: int = 0,
    ) -> None:
        """`hold_back_at`: the score at which a good answer may be held back for the gate's
        replay (unless not `hold_back`), and below which a call fails (None: nothing is held
        back or out); `hold_out`: the share of failing trajectories kept out for the gate
        (`held_out`), chosen with `hold_out_seed`."""
        self.scenario = scenario
        self.counts = ExperienceCounts()
        self.held_out: list[Turn] = []  # failing turns no recipe learns from, oldest first
        records = _deduplicated(_all_records(store, scenario))
        fresh = []
        for record in records:
            if record["id"] in consumed:
                self.counts.consumed += 1
            elif holds_private_data(record):
                self.counts.private += 1
            elif hold_back and hold_back_at is not None and _held_back(record, hold_back_at):
                self.counts.held_back += 1
            elif (
                max_staleness is not None
                and head_number - _number(record["release_id"]) > max_staleness
            ):
                self.counts.stale_skipped += 1
            else:
                fresh.append(record)
        self.trajectories = merge_sessions(fresh)
        if hold_back_at is not None and hold_out > 0:
            self._hold_out(hold_back_at, hold_out, hold_out_seed)
        self.counts.waiting = sum(len(t.turns) for t in self.trajectories)

    def _hold_out(self, threshold: float, share: float, seed: int) -> None:
        """Keep the trajectories that failed (a turn scored below `threshold`) and open with a
        prompt of the held-out `share` out of learning, whole: their failing turns are the
        gate's (`held_out`)."""
        kept = []
        for trajectory in self.trajectories:
            failing = [t for t in trajectory.turns if t.score is not None and t.score < threshold]
            if failing and held_out(trajectory.turns[0].prompt, share, seed):
                self.counts.held_out += len(trajectory.turns)
                self.held_out += failing
            else:
                kept.append(trajectory)
        self.trajectories = kept

    def turns(self) -> list[Turn]:
        return [turn for trajectory in self.trajectories for turn in trajectory.turns]

    def holds(self, learnable: Callable[[Turn], bool], count: int) -> bool:
        """Whether at least `count` turns are ones `learnable` accepts (a recipe's `ready`)."""
        return sum(learnable(turn) for turn in self.turns()) >= count

    def batch_of(self, learnable: Callable[[Turn], bool], count: int) -> list[Trajectory]:
        """Whole trajectories, oldest first, until they hold `count` turns `learnable` accepts
        (a recipe's `build_batch`): a session is learned from whole."""
        batch: list[Trajectory] = []
        held = 0
        for trajectory in self.trajectories:
            if held >= count:
                break
            accepted = sum(learnable(turn) for turn in trajectory.turns)
            if accepted:
                batch.append(trajectory)
                held += accepted
        return batch


def _held_back(record: dict[str, Any], threshold: float) -> bool:
    outside_sessions = record.get("session") is None
    return outside_sessions and held_back(record["id"]) and good(record, threshold)


def holds_private_data(record: dict[str, Any]) -> bool:
    """Whether a record's messages, answer or reports hold private data (read once per record
    and number of reports: a record never changes, its reports only grow)."""
    key = (record["id"], len(record.get("reports") or []))
    if key not in _PRIVATE_SEEN:
        if len(_PRIVATE_SEEN) >= PRIVATE_SEEN_MAX:
            _PRIVATE_SEEN.clear()
        request, response = record.get("request") or {}, record.get("response") or {}
        reports = [(r.get("feedback"), r.get("metadata")) for r in record.get("reports") or []]
        said = [request.get("messages"), response.get("choices"), reports]
        _PRIVATE_SEEN[key] = first_private(said) is not None
    return _PRIVATE_SEEN[key]


PRIVATE_SEEN_MAX = 200_000
_PRIVATE_SEEN: dict[tuple[str, int], bool] = {}


def _all_records(store: ExperienceStore, scenario: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    after = None
    while True:
        page = store.list_records(scenario=scenario, after=after, limit=PAGE)
        records.extend(page)
        if len(page) < PAGE:
            return records
        after = page[-1]["id"]


def _deduplicated(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per session and content hash: the latest copy, carrying the reports of every
    copy that may be learned from (`trains`). Identical turns of different sessions stay apart,
    even in rows stored before the hash included the session."""
    latest: dict[tuple[str | None, str], dict[str, Any]] = {}
    reports: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
    for record in records:
        key = (record.get("session"), record["content_hash"])
        latest[key] = record
        reports.setdefault(key, []).extend(filter(trains, record.get("reports", [])))
    kept = sorted(latest.items(), key=lambda item: item[1]["created_at"])
    return [{**record, "reports": reports[key]} for key, record in kept]


def _number(release_id: str) -> int:
    _, _, number = release_id.rpartition("@")
    return int(number) if number.isdigit() else 0


def merge_sessions(records: list[dict[str, Any]]) -> list[Trajectory]:
    """Records (oldest first) grouped into trajectories, each turn knowing its next state."""
    trajectories: list[Trajectory] = []
    by_session: dict[str, Trajectory] = {}
    for record in records:
        turn = _turn(record)
        session = record.get("session")
        trajectory = by_session.get(session) if session else _extended(trajectories, turn)
        if trajectory is None:
            trajectory = Trajectory(id=session or record["id"], turns=[])
            trajectories.append(trajectory)
            if session:
                by_session[session] = trajectory
        if trajectory.turns:
            previous = trajectory.turns[-1]
            seen = len(previous.messages) + 1
            previous.next_state = turn.messages[seen:] if _extends(turn, previous) else None
        trajectory.turns.append(turn)
    return trajectories


def _turn(record: dict[str, Any]) -> Turn:
    choices = record["response"].get("choices") or [{}]
    return Turn(
        record_id=record["id"],
        messages=list(record["request"].get("messages", [])),
        answer=dict(choices[0].get("message") or {}),
        release_id=record["release_id"],
        reports=list(record.get("reports", [])),
        prompt_token_ids=record.get("prompt_token_ids"),
        completion_token_ids=record.get("completion_token_ids"),
        completion_logprobs=record.get("completion_logprobs"),
        tools=record["request"].get("tools") or None,
    )


def _extends(turn: Turn, previous: Turn) -> bool:
    """True when `turn`'s messages start with `previous`'s messages and answer."""
    before = [*previous.messages, previous.answer]
    if len(turn.messages) <= len(before):
        return False
    return all(_same(a, b) for a, b in zip(turn.messages, before, strict=False))


def _extended(trajectories: list[Trajectory], turn: Turn) -> Trajectory | None:
    for trajectory in reversed(trajectories):
        if trajectory.turns and _extends(turn, trajectory.turns[-1]):
            return trajectory
    return None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    same_text = message_text(a.get("content")) == message_text(b.get("content"))
    return a.get("role") == b.get("role") and same_text
