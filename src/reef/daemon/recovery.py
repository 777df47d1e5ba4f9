"""End the candidates a process that died left `evaluating`, while the server runs.

`reef serve` recovers them as it starts; this keeps doing it as often as a heartbeat may be
missed before an evaluation counts as stopped (`HEARTBEAT_MISSES` x `releases.heartbeat_s`), so a
gate whose process was killed on another replica (its heartbeat stopped, by the database's
clock: `ReleaseWorkflow.recover_interrupted`) is rejected, unjudged, with its records returned,
without waiting for some replica to restart. Any number of replicas may run it: ending a
candidate is one compare-and-set, and the replica that loses it moves on.
"""

from __future__ import annotations

import asyncio
import logging

from reef.releases.workflow import HEARTBEAT_MISSES
from reef.server.state import ServerState
from reef.store.candidates import Candidate

log = logging.getLogger("reef.releases")


class InterruptedRecovery:
    def __init__(self, state: ServerState, interval_s: float | None = None) -> None:
        self.state = state
        self.interval_s = interval_s or HEARTBEAT_MISSES * state.config.releases.heartbeat_s

    def once(self) -> list[Candidate]:
        """Recover what is recoverable now (blocking: store, git); the candidates ended."""
        try:
            ended = self.state.workflow.recover_interrupted()
        except Exception as error:  # the store or the remote away: the next round tries again
            log.warning("could not recover interrupted evaluations: %s", error)
            return []
        for candidate in ended:
            log.warning("candidate %s: %s", candidate.id, candidate.decision)
        return ended

    async def follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await asyncio.to_thread(self.once)
