"""What each scenario serves now: one immutable snapshot, and its one writer.

A call reads the snapshot once (`ServingNow.snapshot`) and is served under the binding it found
there, whatever moves meanwhile. The snapshot is replaced whole, under a lock, by `swap` (a head
that moved: the head follower; a scenario started on a release: `server/start_release.py`),
`failed` and `recovered` (a head that cannot serve, and then can): two writers on two threads
never lose each other's change, as replacing a shared dict from each did.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from reef.inference.binding import BASE_BINDING, Binding


@dataclass(frozen=True)
class ServingSnapshot:
    # What each scenario serves (a scenario not in it serves the model alone, `BASE_BINDING`).
    bindings: Mapping[str, Binding]
    # Why a scenario's head could not be served (scenario -> message; `*`: every head).
    errors: Mapping[str, str]

    def binding(self, scenario: str) -> Binding:
        return self.bindings.get(scenario, BASE_BINDING)


class ServingNow:
    def __init__(self) -> None:
        self._snapshot = ServingSnapshot(MappingProxyType({}), MappingProxyType({}))
        self._lock = threading.Lock()

    @property
    def snapshot(self) -> ServingSnapshot:
        return self._snapshot

    def swap(self, scenario: str, binding: Binding) -> Binding | None:
        """`scenario` serves `binding` from the next call on; what it served before."""
        with self._lock:
            now = self._snapshot
            self._snapshot = ServingSnapshot(
                MappingProxyType({**now.bindings, scenario: binding}), now.errors
            )
            return now.bindings.get(scenario)

    def failed(self, scenario: str, message: str) -> bool:
        """`scenario`'s head cannot serve, for `message`; whether that is news."""
        with self._lock:
            now = self._snapshot
            if now.errors.get(scenario) == message:
                return False
            errors = MappingProxyType({**now.errors, scenario: message})
            self._snapshot = ServingSnapshot(now.bindings, errors)
            return True

    def recovered(self, scenario: str) -> None:
        """`scenario`'s head serves again (or was never broken)."""
        with self._lock:
            now = self._snapshot
            if scenario in now.errors:
                errors = {k: v for k, v in now.errors.items() if k != scenario}
                self._snapshot = ServingSnapshot(now.bindings, MappingProxyType(errors))
