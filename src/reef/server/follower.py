"""Follow each scenario's release head, whichever process moves it, and switch what it serves.

Polls the heads a few times a second. A moved head is checked out and turned into a binding
before it replaces the old one, so a request always sees a whole release, old or new.
"""

from __future__ import annotations

import asyncio
import logging

from reef.server.state import ServerState

log = logging.getLogger("reef.releases")
POLL_SECONDS = 0.2


def load_heads(state: ServerState, known: dict[str, str]) -> None:
    """Bring `state.bindings` up to date with the chain's heads (blocking: git and disk)."""
    chain = state.workflow.chain
    for scenario, commit in chain.head_commits().items():
        if known.get(scenario) == commit:
            continue
        release = chain.head(scenario)
        binding = state.workflow.binding(release)
        state.bindings = {**state.bindings, scenario: binding}
        known[scenario] = commit
        log.info("scenario %s now serves %s (%s)", scenario, binding.release_id, binding.kind)


async def follow_heads(state: ServerState, known: dict[str, str]) -> None:
    while True:
        try:
            await asyncio.to_thread(load_heads, state, known)
        except Exception as error:  # a bad release must not stop serving the current one
            log.error("could not switch to a new release: %s", error)
        await asyncio.sleep(POLL_SECONDS)
