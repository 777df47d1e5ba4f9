"""Follow each scenario's release head, whichever process moves it, and switch what it serves.

Polls the heads a few times a second. A moved head is checked out and turned into a binding
before it replaces the old one, so a request always sees a whole release, old or new. A head
that cannot serve (a broken commit, an artifact that fails to load) leaves its scenario on what
it served before, without holding up the other scenarios or start-up; the problem shows in
`/reef/status` under `release_errors`, is logged once each time it changes, and the head is
tried again every few seconds (a missing git-lfs can be installed meanwhile).

A head with full weights (a checkpoint release) has them loaded by the engine, beside what it
serves, before its binding replaces the old one: requests keep going to the old weights while the
new ones load, and those in flight finish on them (`LlamaCppEngine.load_checkpoint`).

Once a release is swapped in, a few of its own gate tasks are answered again through the live
engine (`reef.daemon.release_probe`): a release that does not answer as its gate judged is
flagged as a mismatch.
"""

from __future__ import annotations

import asyncio
import logging
import time

from reef.daemon import release_probe
from reef.engines.base import LoadsCheckpoints
from reef.inference.binding import Binding
from reef.releases.chain import Release
from reef.server.state import ServerState

log = logging.getLogger("reef.releases")
POLL_SECONDS = 0.2
RETRY_BROKEN_SECONDS = 5.0
ALL_SCENARIOS = "*"


class HeadFollower:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.serving_commits: dict[str, str] = {}  # scenario -> head commit it serves
        self.retry_at: dict[str, float] = {}  # scenario -> when to try a broken head again
        # Whether the heads were read once: a head loaded then is what the server starts
        # with, not a switch (`reef:release_switches` counts the later ones).
        self.loaded = False
        # The event loop the engine runs on, for loading a checkpoint from the follower's thread.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def load_heads(self) -> None:
        """Bring `state.bindings` up to date with the chain's heads (blocking: git and disk)."""
        try:
            heads = self.state.workflow.chain.head_commits()
        except Exception as error:
            self._report(ALL_SCENARIOS, f"could not read the release heads: {error}")
            return
        self._clear(ALL_SCENARIOS)
        for scenario, commit in heads.items():
            if self.serving_commits.get(scenario) == commit:
                continue
            if time.monotonic() < self.retry_at.get(scenario, 0.0):
                continue
            self._switch(scenario, commit)
        self.loaded = True

    def _switch(self, scenario: str, commit: str) -> None:
        state = self.state
        started = time.perf_counter()
        try:
            head = state.workflow.chain.head(scenario)
            binding = state.workflow.binding(head)
            self._load_weights(binding)
        except Exception as error:
            self.retry_at[scenario] = time.monotonic() + RETRY_BROKEN_SECONDS
            serving = state.bindings[scenario].release_id if scenario in state.bindings else "base"
            self._report(
                scenario,
                f"head {commit[:12]} cannot serve ({type(error).__name__}: {error}); "
                f"still serving {serving}",
            )
            return
        before = state.serving.swap(scenario, binding)
        if self.loaded and (before is None or before.release_id != binding.release_id):
            state.metrics.switches.labels(scenario).inc()
            state.metrics.switch_seconds.labels(scenario).observe(time.perf_counter() - started)
            if head is not None:
                try:
                    self._probe(scenario, head, binding)
                except Exception as error:  # a probe never stops the follower or a swap
                    log.warning("could not plan a probe of %s: %s", binding.release_id, error)
        self.serving_commits[scenario] = commit
        self.retry_at.pop(scenario, None)
        self._clear(scenario)
        log.info("scenario %s now serves %s (%s)", scenario, binding.release_id, binding.kind)

    def _load_weights(self, binding: Binding) -> None:
        """Have the engine load a checkpoint's weights now, so no request waits for them."""
        engine = self.state.engine
        if not isinstance(engine, LoadsCheckpoints) or self._loop is None:
            return
        arms = binding.routing.routes if binding.routing is not None else ()
        served = [binding, *(arm.binding for _, route_arms in arms for arm in route_arms)]
        for checkpoint in dict.fromkeys(b.checkpoint for b in served if b.checkpoint):
            loading = engine.load_checkpoint(checkpoint)
            asyncio.run_coroutine_threadsafe(loading, self._loop).result()

    def _probe(self, scenario: str, release: Release, binding: Binding) -> None:
        """Answer some of the release's gate tasks through the live engine, on the event loop,
        without holding up the follower; a release that cannot be probed clears any flag."""
        plan = release_probe.probe_plan(self.state, release, binding)
        if plan is None or self._loop is None:
            nothing = release_probe.ProbeResult(release.release_id, probed=0)
            release_probe.record(self.state, scenario, nothing)
            return

        async def probe_and_record() -> None:
            try:
                found = await release_probe.probe(self.state, release, binding, plan)
            except Exception as error:  # the engine is busy or stopping: nothing is claimed
                log.warning("could not probe %s after its swap: %s", release.release_id, error)
                return
            if self.state.bindings.get(scenario) is binding:  # still what serves
                release_probe.record(self.state, scenario, found)

        asyncio.run_coroutine_threadsafe(probe_and_record(), self._loop)

    def _report(self, scenario: str, message: str) -> None:
        if self.state.serving.failed(scenario, message):
            log.error("scenario %s: %s", scenario, message)

    def _clear(self, scenario: str) -> None:
        self.state.serving.recovered(scenario)

    async def follow(self) -> None:
        while True:
            await asyncio.to_thread(self.load_heads)
            await asyncio.sleep(POLL_SECONDS)
