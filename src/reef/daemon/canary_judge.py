"""Judge running canaries from their live reports, and end them (`reef.releases.canary`).

Every `gate.canary.check_s` the server looks at each candidate on a canary. With several
replicas sharing a store, one of them judges each scenario: the holder of the store's lease
`canary:<scenario>`. A promotion or a rollback is a publish, which every replica then follows.
The latest verdict of each canary is kept for `/reef/status` (`canaries`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from reef.releases.canary import Verdict, arm_scores, judge
from reef.server.state import ServerState
from reef.store.candidates import Candidate
from reef.store.leases import new_holder, take_lease

log = logging.getLogger("reef.releases")


class CanaryJudge:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.holder = new_holder()

    def check(self) -> None:
        """Judge every running canary this server holds the lease of (blocking: store, git)."""
        workflow = self.state.workflow
        try:
            running = workflow.candidates.list(state="canary")
        except Exception as error:  # the store is away: the next check tries again
            log.warning("could not list the canaries: %s", error)
            return
        verdicts = {}
        for candidate in running:
            try:  # the store or the chain away: this canary waits for the next check
                verdicts[candidate.id] = verdict = self._judge(candidate)
                if verdict is None or verdict.action == "wait":
                    continue
                ended = workflow.canaries.end(
                    candidate.id, verdict.action == "promote", verdict.why
                )
            except Exception as error:
                log.warning("could not judge or end the canary of %s: %s", candidate.id, error)
                continue
            log.info("canary of %s ended: %s", candidate.id, ended.decision)
        self.state.canaries = {key: v for key, v in verdicts.items() if v is not None}

    def _judge(self, candidate: Candidate) -> Verdict | None:
        state = self.state
        settings = state.config.gate_for(candidate.scenario).canary
        period = max(state.config.learning.lease_s, 3 * settings.check_s)
        if not take_lease(state.store, f"canary:{candidate.scenario}", self.holder, period):
            return None  # another replica judges it
        assert candidate.release_id is not None
        scores = arm_scores(state.store, candidate.release_id, settings.score_range)
        return judge(settings, scores, time.time() - candidate.updated_at)

    async def follow(self) -> None:
        while True:
            await asyncio.to_thread(self.check)
            await asyncio.sleep(self._interval())

    def _interval(self) -> float:
        """The shortest `check_s` of the scenarios being served."""
        config = self.state.config
        checks = [config.gate_for(scenario).canary.check_s for scenario in self.state.bindings]
        return min(checks, default=config.gate.canary.check_s)
