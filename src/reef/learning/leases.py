"""The learning worker's leases: one worker learns on each scenario, across replicas.

A `LeaseKeeper` takes or renews each scenario's lease (`reef.store.leases`, named
`learner:<scenario>`) every third of its period on a thread of its own, so that a publish (an
LFS push for half an hour) or anything else holding the event loop never stops the renewals. It
knows whether this worker leads a scenario now, and gives a publish its fence: the generation
of the lease held when the step began, refused once another worker took the lease since.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable

from reef.store import ExperienceStore
from reef.store.leases import confirm_lease, give_up_lease, new_holder, take_lease

log = logging.getLogger("reef.learning")
SURE_SHARE = 0.8  # of a period after asking: how long a renewed lease is surely held here


class LeaseKeeper:
    def __init__(self, store: ExperienceStore, period: float) -> None:
        self.store = store
        self.period = period
        self.holder = new_holder()  # this worker, as the holder of scenarios' leases
        # Scenario -> until when (time.monotonic()) this worker surely holds its lease: the
        # moment it asked, plus most of a period. A renewal that hangs (a lost connection, a
        # lock held by another process) lets it run out here before it runs out in the store.
        self.lead_until: dict[str, float] = {}
        # Scenario -> the generation of its lease this worker holds: a publish carries it, and
        # is refused (`confirm_lease`) once another worker took the lease since.
        self.generations: dict[str, int] = {}

    async def keep(self, scenarios: Iterable[str], stop: asyncio.Event) -> None:
        """Take or renew each scenario's lease every third of the period, until `stop`."""
        stopped = threading.Event()
        names = list(scenarios)

        def renew() -> None:
            while not stopped.is_set():
                for scenario in names:
                    self.renew(scenario, self.period)
                stopped.wait(self.period / 3)

        renewing = asyncio.create_task(asyncio.to_thread(renew))
        try:
            await stop.wait()
        finally:
            stopped.set()
            await asyncio.shield(renewing)

    async def hold(self, scenario: str, period: float) -> None:
        await asyncio.to_thread(self.renew, scenario, period)

    def renew(self, scenario: str, period: float) -> None:
        asked = time.monotonic()
        try:
            held = take_lease(self.store, _name(scenario), self.holder, period)
        except Exception as error:  # the store is unreachable: whoever can reach it leads
            log.warning("could not renew the lease of %s: %s", scenario, error)
            held = False
        if held and not self.leads(scenario):
            log.info("%s: this worker learns (it holds the lease, %s)", scenario, self.holder)
        elif not held and scenario in self.lead_until:
            log.warning("%s: this worker no longer holds the lease; it stops learning", scenario)
        if held:
            self.generations[scenario] = int(held)
            self.lead_until[scenario] = asked + SURE_SHARE * period
        else:
            self.lead_until.pop(scenario, None)

    def fence(self, scenario: str) -> Callable[[], None] | None:
        """What a publish of `scenario` calls right before its head moves: refused
        (`LeaseLost`) unless this worker still holds the lease in the generation it had when
        the step began. None for a step taken outside the loop, under no lease (`reef learn
        --once`, like `reef release publish`): only the chain's expected-parent check holds."""
        generation = self.generations.get(scenario)
        if generation is None:
            return None
        return functools.partial(
            confirm_lease, self.store, _name(scenario), self.holder, generation, self.period
        )

    def leads(self, scenario: str) -> bool:
        """Whether this worker holds the scenario's lease now (for sure)."""
        return time.monotonic() < self.lead_until.get(scenario, 0.0)

    def give_up(self) -> None:
        """On a clean stop: another worker need not wait for the leases to expire."""
        for scenario in list(self.lead_until):
            with contextlib.suppress(Exception):
                give_up_lease(self.store, _name(scenario), self.holder)
        self.lead_until.clear()


def _name(scenario: str) -> str:
    return f"learner:{scenario}"
