"""The archive: the best states found so far, and which to start the next rollouts from.

Discovery reuses its best states as starting points, with TTT-Discover's PUCT rule. Each state
keeps its reward R, its lineage (parent first, back to the seeded state), how often it or a
descendant was expanded (n), and the best reward of a rollout started from it. The next starting
states are the highest scores

    score(s) = Q(s) + c · P(s) · sqrt(1 + T) / (1 + n(s))

- Q(s): R(s) until s is expanded, then the best reward among its rollouts (its children), even
  when that is below R(s); measured as (Q - R_min) / (R_max - R_min) over the archive's rewards,
  which ranks states as the reference's Q + c · (R_max - R_min) · P · … does, whatever the
  task's reward scale;
- P(s): a prior by rank of reward, the best state first: (N - rank) / (1 + 2 + ... + N);
- n(s): the groups of rollouts started from s or from any of its descendants (a visit counts
  for every ancestor); T: all groups so far.

Starts chosen together share no lineage: none is an ancestor or a descendant of another, so a
step may start from fewer states than asked. A child with the same centres as a state already
in the archive (its parent, a sibling) is not added, and each state keeps at most
`children_per_state` children in the archive, the best ones. The archive keeps its `capacity`
best states.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIN_SPAN = 1e-6  # the least span Q is measured over (all rewards equal), as in the reference


@dataclass
class State:
    id: int
    centres: list[list[float]]
    reward: float
    ancestors: list[int] = field(default_factory=list)  # parent first, back to the seeded state
    visits: int = 0  # groups of rollouts started from this state or from a descendant
    best_child: float | None = None  # the best reward of a rollout started from this state

    @property
    def parent(self) -> int | None:
        return self.ancestors[0] if self.ancestors else None

    @property
    def q(self) -> float:
        """Q before scaling: the best child's reward once expanded, the state's own before."""
        return self.reward if self.best_child is None else self.best_child

    def related(self, other: State) -> bool:
        """The same state, or an ancestor or a descendant of the other."""
        return self.id == other.id or self.id in other.ancestors or other.id in self.ancestors

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        data = dict(data)
        if "parent" in data:  # an archive saved before lineage was kept: the parent only
            parent = data.pop("parent")
            data["ancestors"] = [] if parent is None else [parent]
        return cls(**data)


@dataclass
class Archive:
    capacity: int = 16
    exploration: float = 1.0  # c in the PUCT score
    children_per_state: int = 2  # the reference's topk_children
    states: list[State] = field(default_factory=list)
    expansions: int = 0  # T
    next_id: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per step

    # -- building ---------------------------------------------------------------------------------

    def add(
        self, centres: list[list[float]], reward: float, parent: State | None = None
    ) -> State | None:
        """A new state, or None where the archive holds the same centres already or `parent`
        has `children_per_state` children as good or better."""
        if self._holds(centres) or not self._has_room(parent, reward):
            return None
        lineage = [] if parent is None else [parent.id, *parent.ancestors]
        state = State(self.next_id, centres, reward, lineage)
        self.next_id += 1
        if parent is not None:
            self._drop_worst_beyond_cap(parent.id)
        self.states.append(state)
        self.states.sort(key=lambda s: -s.reward)
        del self.states[self.capacity :]
        return state

    def expanded(self, state_id: int, rewards: list[float]) -> None:
        """Record a group of rollouts started from a state: its best child, and a visit for it
        and for each ancestor still in the archive (it may have left the archive itself)."""
        self.expansions += 1
        start = self._find(state_id)
        if start is None:
            return
        best = max(rewards)
        start.best_child = best if start.best_child is None else max(start.best_child, best)
        visited = {start.id, *start.ancestors}
        for state in self.states:
            if state.id in visited:
                state.visits += 1

    @property
    def best(self) -> State:
        return self.states[0]

    def children(self, parent_id: int) -> list[State]:
        """The parent's children in the archive, best first."""
        return [s for s in self.states if s.parent == parent_id]

    def _find(self, state_id: int) -> State | None:
        return next((s for s in self.states if s.id == state_id), None)

    def _holds(self, centres: list[list[float]]) -> bool:
        return any(s.centres == centres for s in self.states)

    def _has_room(self, parent: State | None, reward: float) -> bool:
        if parent is None:
            return True
        siblings = self.children(parent.id)
        return len(siblings) < self.children_per_state or reward > siblings[-1].reward

    def _drop_worst_beyond_cap(self, parent_id: int) -> None:
        """Make room for one more child: drop the worst (on a tie, the newest) if at the cap."""
        siblings = self.children(parent_id)
        if len(siblings) >= self.children_per_state:
            self.states.remove(siblings[-1])

    # -- choosing ---------------------------------------------------------------------------------

    def puct_scores(self) -> dict[int, float]:
        rewards = [s.reward for s in self.states]
        low = min(rewards)
        span = max(max(rewards) - low, MIN_SPAN)
        count = len(self.states)
        prior_total = count * (count + 1) / 2
        root = math.sqrt(1 + self.expansions)
        scores = {}
        for rank, state in enumerate(self.states):  # sorted best first: rank 0 is the best
            prior = (count - rank) / prior_total
            bonus = self.exploration * prior * root / (1 + state.visits)
            scores[state.id] = (state.q - low) / span + bonus
        return scores

    def choose(self, count: int) -> list[State]:
        """Up to `count` states by PUCT score (ties: the better reward), skipping any related
        to one already chosen."""
        scores = self.puct_scores()
        chosen: list[State] = []
        for state in sorted(self.states, key=lambda s: (-scores[s.id], -s.reward)):
            if len(chosen) == count:
                break
            if not any(state.related(other) for other in chosen):
                chosen.append(state)
        return chosen

    # -- keeping ----------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self)))
        temporary.replace(path)

    @classmethod
    def load(cls, path: Path) -> Archive:
        data = json.loads(path.read_text())
        states = [State.from_dict(s) for s in data.pop("states")]
        return cls(**data, states=states)
