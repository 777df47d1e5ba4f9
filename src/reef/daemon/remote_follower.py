"""Keep this replica's copy of the release chain up to date with the shared remote.

With `releases.remote`, every replica publishes to one git remote, and each must serve a new
head within moments of its publication wherever it happened. A publish tells the replicas
through the store when it can (PostgreSQL's NOTIFY on `reef_releases`): this replica then asks
the remote at once. It also polls (`releases.poll_s`; ten times slower when notified), so that a
notification lost while the database was away costs only time. A fetched head lands in the local
copy, where `HeadFollower` switches what the scenario serves. A remote that cannot be reached
leaves the replica serving what it has; `/reef/status` says so (`releases.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from reef.releases.remote import RemoteUnreachable
from reef.releases.workflow import RELEASES_CHANNEL
from reef.server.state import ServerState

log = logging.getLogger("reef.releases")


class RemoteFollower:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.chain = state.workflow.chain
        self._wake = asyncio.Event()
        self._stop_listening = threading.Event()
        self._told_unreachable = False

    def catch_up(self) -> None:
        """One look at the remote (blocking: git)."""
        try:
            if self.chain.catch_up():
                log.info("fetched new release heads from the release remote")
            self._told_unreachable = False
        except RemoteUnreachable as error:
            if not self._told_unreachable:
                log.error("%s", error.message)
                self._told_unreachable = True
        except Exception:  # never the end of following: the next look may do better
            log.exception("could not catch up with the release remote")

    async def follow(self) -> None:
        """Catch up whenever told, and every poll period, until cancelled."""
        store = self.state.store
        poll = self.state.config.releases.poll_s * (10 if store.notifies else 1)
        loop = asyncio.get_running_loop()
        listener = None
        if store.notifies:

            def woken(_: str = "") -> None:
                loop.call_soon_threadsafe(self._wake.set)

            listener = loop.run_in_executor(
                None, store.listen, RELEASES_CHANNEL, woken, self._stop_listening, woken
            )
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=poll)
                self._wake.clear()
                await asyncio.to_thread(self.catch_up)
        finally:
            self._stop_listening.set()
            if listener is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(listener)
