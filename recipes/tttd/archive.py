"""The archive: the best states found so far, and which to start the next rollouts from.

Discovery reuses its best states as starting points, as TTT-Discover does. Each state keeps its
reward, how often it was expanded (rollouts started from it, in groups), and the best reward any
of those rollouts reached. The next starting states are the highest PUCT scores:

    score(s) = Q(s) + c · P(s) · sqrt(1 + T) / (1 + n(s))

- Q(s): the best reward reached from s (its own reward before it is expanded), scaled to [0, 1]
  over the archive, so that c means the same whatever the task's reward scale;
- P(s): a prior by rank, the best state first: (N - rank) / (1 + 2 + ... + N);
- n(s): the times s was expanded; T: all expansions so far.

A state that was never expanded gets a large exploration bonus; one expanded often must keep
producing good children to be chosen again. The archive keeps its `capacity` best states.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class State:
    id: int
    centres: list[list[float]]
    reward: float
    parent: int | None = None
    visits: int = 0  # groups of rollouts started from this state
    best_child: float | None = None  # the best reward those rollouts reached

    @property
    def reached(self) -> float:
        return self.reward if self.best_child is None else max(self.reward, self.best_child)


@dataclass
class Archive:
    capacity: int = 16
    exploration: float = 1.0  # c in the PUCT score
    states: list[State] = field(default_factory=list)
    expansions: int = 0  # T
    next_id: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per step

    # -- building ---------------------------------------------------------------------------------

    def add(self, centres: list[list[float]], reward: float, parent: int | None = None) -> State:
        state = State(self.next_id, centres, reward, parent)
        self.next_id += 1
        self.states.append(state)
        self.states.sort(key=lambda s: -s.reward)
        del self.states[self.capacity :]
        return state

    def expanded(self, state_id: int, rewards: list[float]) -> None:
        """Record a group of rollouts started from a state (it may have left the archive)."""
        self.expansions += 1
        for state in self.states:
            if state.id == state_id:
                state.visits += 1
                best = max(rewards)
                state.best_child = best if state.best_child is None else max(state.best_child, best)

    @property
    def best(self) -> State:
        return self.states[0]

    # -- choosing ---------------------------------------------------------------------------------

    def puct_scores(self) -> dict[int, float]:
        reached = [s.reached for s in self.states]
        low, high = min(reached), max(reached)
        span = high - low
        count = len(self.states)
        prior_total = count * (count + 1) / 2
        scores = {}
        for rank, state in enumerate(self.states):  # sorted best first: rank 0 is the best
            q = (state.reached - low) / span if span > 0 else 1.0
            prior = (count - rank) / prior_total
            bonus = self.exploration * prior * math.sqrt(1 + self.expansions) / (1 + state.visits)
            scores[state.id] = q + bonus
        return scores

    def choose(self, count: int) -> list[State]:
        """The `count` states with the highest PUCT scores (ties: the better reward)."""
        scores = self.puct_scores()
        ranked = sorted(self.states, key=lambda s: (-scores[s.id], -s.reward))
        return ranked[:count]

    # -- keeping ----------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self)))
        temporary.replace(path)

    @classmethod
    def load(cls, path: Path) -> Archive:
        data = json.loads(path.read_text())
        states = [State(**s) for s in data.pop("states")]
        return cls(**data, states=states)
