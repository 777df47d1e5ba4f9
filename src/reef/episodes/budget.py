"""What one episode's token may send: a budget of calls and of request bytes, beyond the cgroup.

The sandbox bounds what an agent does on the host; its token reaches the server, outside the
cgroup, where every call it sends is stored. Issue 74 saw an episode send 12 calls of 30 MiB
and grow `experience.db` by 391 MiB in 17 seconds. So the server counts each episode's calls and
request bytes (`episodes.token_calls`, `episodes.token_bytes`) and, once either is spent,
answers 429 with a JSON error saying which; nothing of a refused call is stored. Counts live in
the serving process, per episode, until its token expires (an episode is served by the server
its runner names, so one process sees all its calls).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from reef.episodes.tokens import EpisodeGrant
from reef.errors import ReefError


class EpisodeBudgetSpent(ReefError):
    status = 429
    type = "rate_limit_error"
    code = "episode_budget"


@dataclass
class _Spent:
    calls: int
    bytes: int
    expires_at: float


class EpisodeBudgets:
    """Each live episode's calls and request bytes so far, against the configured budget."""

    def __init__(self, calls: int, request_bytes: int) -> None:
        self.calls = calls
        self.request_bytes = request_bytes
        self._spent: dict[str, _Spent] = {}
        self._lock = threading.Lock()

    def take_call(self, grant: EpisodeGrant) -> int:
        """Count a call of `grant`'s episode and give the request bytes it may still send;
        `EpisodeBudgetSpent` when its calls are spent."""
        now = time.time()
        with self._lock:
            self._forget_expired(now)
            spent = self._spent.setdefault(grant.episode, _Spent(0, 0, grant.expires_at))
            if spent.calls >= self.calls:
                raise EpisodeBudgetSpent(
                    f"episode {grant.episode} has sent its {self.calls} calls "
                    "(episodes.token_calls): the episode ends here; raise the budget in "
                    "reef.yaml if its tasks need more"
                )
            spent.calls += 1
            return self.request_bytes - spent.bytes

    def add_bytes(self, grant: EpisodeGrant, count: int) -> None:
        with self._lock:
            spent = self._spent.get(grant.episode)
            if spent is not None:
                spent.bytes += count

    def spent_bytes(self, grant: EpisodeGrant) -> EpisodeBudgetSpent:
        """The refusal of a call whose body would pass the episode's byte budget."""
        return EpisodeBudgetSpent(
            f"episode {grant.episode} would pass its {self.request_bytes} request bytes "
            "(episodes.token_bytes) with this call: the episode ends here; raise the budget in "
            "reef.yaml if its tasks need more"
        )

    def _forget_expired(self, now: float) -> None:
        for episode in [e for e, spent in self._spent.items() if spent.expires_at < now]:
            del self._spent[episode]
