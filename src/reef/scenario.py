"""Scenario names, the scenario a request names, and the scenarios a server knows at runtime
(kept in the store: `reef.store.scenarios`).

Names appear in headers, file names and git refs, so they are kept plain. A request names its
scenario in the `x-reef-scenario` header (upstream Reef's clients send nothing else), or, on the
routes that always took one, in a query parameter, a path segment or a body field: both may be
sent, and then they must agree.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from reef.errors import BadRequest, NotFound
from reef.store.scenarios import (
    RuntimeScenario,
    create_scenario,
    runtime_scenarios,
    select_training_mode,
)

if TYPE_CHECKING:
    from reef.config import ReefConfig
    from reef.store import ExperienceStore

DEFAULT_SCENARIO = "default"
SCENARIO_HEADER = "x-reef-scenario"
# Matched whole, with `.fullmatch`: `^...$` would let a trailing newline through (`default\n`, into
# a git ref name).
SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
TRAINING_MODES = ("auto", "manual", "hybrid")


def check_scenario(name: str) -> str:
    if not SCENARIO_NAME.fullmatch(name):
        raise BadRequest(
            f"{name!r} is not a valid scenario name: use letters, digits, '_' and '-', "
            "starting with a letter or digit, at most 64 characters"
        )
    return name


def scenario_named(
    headers: Mapping[str, str],
    given: str | None = None,
    given_as: str = "the request",
    default: str = DEFAULT_SCENARIO,
) -> str:
    """The scenario a request names: its `x-reef-scenario` header or `given` (a query parameter,
    path segment or body field, which errors call `given_as`), `default` with neither. A header
    and a `given` that differ are refused, naming both."""
    header = headers.get(SCENARIO_HEADER) or None
    if header is not None and given is not None and header != given:
        raise BadRequest(
            f"{SCENARIO_HEADER} names scenario {header!r} but {given_as} names {given!r}: "
            "send one of them, or the same name in both",
            code="scenario_mismatch",
        )
    if header is not None:
        try:
            return check_scenario(header)
        except BadRequest as error:
            raise BadRequest(f"{SCENARIO_HEADER}: {error.message}") from None
    return check_scenario(given if given is not None else default)


class RuntimeScenarios:
    """What a server learns about scenarios while it runs, besides what its configuration names
    and its release chain holds: the scenarios created with `POST /reef/scenarios` (or by an
    `x-reef-release-id` on a call), and the training mode chosen for a scenario with `POST
    /reef/scenarios/{s}/update`.

    In the store (`reef.store.scenarios`), so every replica and the learning worker see the same
    and a restart keeps them; read through a cache of `CACHE_S`. Without a store (a test's, or a
    tool's), in memory.
    """

    CACHE_S = 1.0

    def __init__(self, store: ExperienceStore | None = None) -> None:
        self.store = store
        self._memory: dict[str, RuntimeScenario] = {}
        self._read: tuple[float, dict[str, RuntimeScenario]] | None = None
        self.lock = threading.Lock()  # held by who creates a scenario (`POST /reef/scenarios`)

    def _scenarios(self) -> dict[str, RuntimeScenario]:
        if self.store is None:
            return self._memory
        cached = self._read
        if cached is None or time.monotonic() - cached[0] > self.CACHE_S:
            cached = (time.monotonic(), runtime_scenarios(self.store))
            self._read = cached
        return cached[1]

    @property
    def created(self) -> frozenset[str]:
        return frozenset(self._scenarios())

    def start_release(self, name: str) -> str | None:
        """The release `name` was created from, if it was created naming one."""
        found = self._scenarios().get(name)
        return found.start_release_id if found else None

    def knows(self, name: str, config: ReefConfig, serving: Collection[str]) -> bool:
        """Whether `name` is configured (`scenarios:`, `learning.scenarios`, `default`), has a
        release (`serving`: the scenarios bound to one) or was created at runtime."""
        configured = {DEFAULT_SCENARIO, *config.learning.scenarios, *config.scenarios}
        return name in configured or name in serving or name in self.created

    def require(self, name: str, config: ReefConfig, serving: Collection[str]) -> str:
        """`name`, unless this server creates no scenario implicitly and does not know it."""
        if config.server.allow_implicit_scenario_creation or self.knows(name, config, serving):
            return name
        raise NotFound(
            f"no scenario {name!r}: this server creates none implicitly "
            "(server.allow_implicit_scenario_creation is false); create it with "
            f'POST /reef/scenarios {{"name": "{name}"}}, or check {SCENARIO_HEADER}',
            code="unknown_scenario",
        )

    def create(self, name: str, start_release_id: str | None = None) -> None:
        if self.store is None:
            if name not in self._memory:
                self._memory = {**self._memory, name: RuntimeScenario(name, None, start_release_id)}
            return
        create_scenario(self.store, name, start_release_id)
        self._read = None

    def select_mode(self, name: str, mode: str) -> None:
        if self.store is None:
            known = self._memory.get(name)
            start = known.start_release_id if known else None
            self._memory = {**self._memory, name: RuntimeScenario(name, mode, start)}
            return
        select_training_mode(self.store, name, mode)
        self._read = None

    def training_mode(self, name: str, configured: str) -> str:
        """The mode `name` learns in: the one selected at runtime, else `configured`."""
        found = self._scenarios().get(name)
        return found.training_mode if found and found.training_mode else configured
