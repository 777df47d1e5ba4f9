"""Scenario names, the scenario a request names, and the scenarios a server knows at runtime.

Names appear in headers, file names and git refs, so they are kept plain. A request names its
scenario in the `x-reef-scenario` header (upstream Reef's clients send nothing else), or, on the
routes that always took one, in a query parameter, a path segment or a body field: both may be
sent, and then they must agree.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from reef.errors import BadRequest, NotFound

if TYPE_CHECKING:
    from reef.config import ReefConfig

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
    and its release chain holds: the scenarios created with `POST /reef/scenarios`, and the
    training mode chosen for a scenario with `POST /reef/scenarios/{s}/update`.

    In memory, per server process: a restart forgets both (a scenario with a release or in the
    configuration is still known; the configured mode applies again). Both are replaced whole,
    never mutated, so readers on other threads see one version or the next.
    """

    def __init__(self) -> None:
        self.created: frozenset[str] = frozenset()
        self.training_modes: dict[str, str] = {}
        self.lock = threading.Lock()  # held by who creates a scenario (`POST /reef/scenarios`)

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

    def create(self, name: str) -> None:
        self.created = self.created | {name}

    def select_mode(self, name: str, mode: str) -> None:
        self.training_modes = {**self.training_modes, name: mode}

    def training_mode(self, name: str, configured: str) -> str:
        """The mode `name` learns in: the one selected at runtime, else `configured`."""
        return self.training_modes.get(name, configured)
