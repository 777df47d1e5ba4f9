"""A release's routing policy (`routing.yaml`): which release serves which share of sessions.

    routes:
      - when: {headers: {x-user-tier: beta}}     # optional; the last route has no `when`
        arms:
          - {name: canary, release: self, share: 100}
      - arms:
          - {name: stable, release: default@3, share: 90}
          - {name: canary, release: self, share: 10}

A call takes the first route whose conditions it meets, then an arm by its session: the arm is a
function of a hash of the policy's release and `x-reef-session`, so a session stays on its arm
for as long as the policy serves (a call without a session draws an arm at random, by the
shares). `release` names a release of the scenario, `base` (the model alone) or `self` (this
release's own parts). An arm serves that release's parts, never its routing.

The policy is checked when it is proposed (`check_policy`): an unknown key or condition, shares
that are not whole numbers summing to 100, a release that does not exist, or a last route with
conditions is a rejected candidate whose reason names the line.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import yaml

from reef.errors import ReefError
from reef.yamlfile import DuplicateKey, refuse_duplicate_keys

POLICY_FILE = "routing.yaml"
SELF = "self"
BASE = "base"
_ROUTE_KEYS = {"when", "arms"}
_ARM_KEYS = {"name", "release", "share"}
_CONDITIONS = {"headers"}
# What an arm serves: a `reef.inference.binding.Binding` (which holds a `Routing` in turn, so
# routing names it only as a type parameter).
Served = TypeVar("Served")


@dataclass(frozen=True)
class ArmSpec:
    name: str
    release: str  # a release id, `base` or `self`
    share: int  # percent of the route's sessions
    line: int = 0  # where routing.yaml names it, for messages


@dataclass(frozen=True)
class RouteSpec:
    headers: tuple[tuple[str, str], ...]  # every header must have this value; () for any call
    arms: tuple[ArmSpec, ...]

    def matches(self, headers: Mapping[str, str]) -> bool:
        return all(headers.get(name) == value for name, value in self.headers)


@dataclass(frozen=True)
class Arm(Generic[Served]):
    """An arm as it serves: its name and what serves it (a `reef.inference.binding.Binding`)."""

    name: str
    share: int
    binding: Served


@dataclass(frozen=True)
class Routing(Generic[Served]):
    """The routing policy of the release `release_id`, each arm with its binding."""

    release_id: str
    routes: tuple[tuple[RouteSpec, tuple[Arm[Served], ...]], ...]

    def choose(self, headers: Mapping[str, str], session: str | None) -> Arm[Served]:
        """The arm that serves a call with these headers and this session."""
        for route, arms in self.routes:
            if route.matches(headers):
                return _by_share(arms, self._percent(session))
        return self.routes[-1][1][0]  # unreachable for a checked policy: its last route is open

    def _percent(self, session: str | None) -> float:
        if session is None:
            return random.random() * 100
        digest = hashlib.sha256(f"{self.release_id}\0{session}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % 10_000 / 100

    def arm_names(self) -> list[str]:
        return list(dict.fromkeys(arm.name for _, arms in self.routes for arm in arms))


def _by_share(arms: tuple[Arm[Served], ...], percent: float) -> Arm[Served]:
    edge = 0.0
    for arm in arms:
        edge += arm.share
        if percent < edge:
            return arm
    return arms[-1]


def parse_policy(text: str) -> tuple[RouteSpec, ...]:
    """The routes of a policy, checked for shape (not for which releases exist); ReefError
    naming the line otherwise."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        refuse_duplicate_keys(root, POLICY_FILE)
    except yaml.YAMLError as error:
        raise _refused(f"{POLICY_FILE} is not valid YAML: {error}") from None
    except DuplicateKey as error:
        raise _refused(str(error)) from None
    mapping = _mapping(root, "the policy")
    _known_keys(mapping, {"routes"}, "the policy")
    routes_node = _required(mapping, "routes", root)
    if not isinstance(routes_node, yaml.SequenceNode) or not routes_node.value:
        raise _at(routes_node, "routes must be a list of one route or more")
    routes = tuple(_route(node) for node in routes_node.value)
    for node, route in zip(routes_node.value[:-1], routes[:-1], strict=True):
        if not route.headers:
            raise _at(
                node, "only the last route may have no `when`: the routes after it never serve"
            )
    if routes[-1].headers:
        raise _at(
            routes_node.value[-1], "the last route must have no `when`: it serves every other call"
        )
    return routes


def check_policy(text: str, release_exists: Callable[[str], bool]) -> tuple[RouteSpec, ...]:
    """`parse_policy`, and every arm's release exists (`self` and `base` always do)."""
    routes = parse_policy(text)
    for arm in (arm for route in routes for arm in route.arms):
        if arm.release not in (SELF, BASE) and not release_exists(arm.release):
            raise _refused(
                f"{POLICY_FILE} line {arm.line}: arm {arm.name!r}: there is no release "
                f"{arm.release!r}"
            )
    return routes


def canary_policy(stable: str, share: int) -> bytes:
    """The policy of a canary: `share` percent of sessions on this release, the rest on
    `stable`."""
    arms = [
        {"name": "stable", "release": stable, "share": 100 - share},
        {"name": "canary", "release": SELF, "share": share},
    ]
    return yaml.safe_dump({"routes": [{"arms": arms}]}, sort_keys=False).encode()


# -- reading the YAML nodes, with their lines ---------------------------------------------------


def _route(node: yaml.Node) -> RouteSpec:
    mapping = _mapping(node, "a route")
    _known_keys(mapping, _ROUTE_KEYS, "a route")
    headers: tuple[tuple[str, str], ...] = ()
    if "when" in mapping:
        headers = _conditions(mapping["when"][1])
    arms_node = _required(mapping, "arms", node)
    if not isinstance(arms_node, yaml.SequenceNode) or not arms_node.value:
        raise _at(arms_node, "arms must be a list of one arm or more")
    arms = tuple(_arm(arm) for arm in arms_node.value)
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names):
        raise _at(arms_node, f"two arms of one route share a name: {', '.join(names)}")
    total = sum(arm.share for arm in arms)
    if total != 100:
        raise _at(arms_node, f"the arms' shares sum to {total}, not 100")
    return RouteSpec(headers, arms)


def _conditions(node: yaml.Node) -> tuple[tuple[str, str], ...]:
    mapping = _mapping(node, "`when`")
    for key, (key_node, _) in mapping.items():
        if key not in _CONDITIONS:
            known = ", ".join(sorted(_CONDITIONS))
            raise _at(key_node, f"unknown condition {key!r}: a route's `when` may hold {known}")
    if "headers" not in mapping:
        raise _at(node, "`when` names no condition")
    headers = _mapping(mapping["headers"][1], "`when.headers`")
    if not headers:
        raise _at(mapping["headers"][1], "`when.headers` names no header")
    pairs = []
    for name, (_, value) in headers.items():
        if not isinstance(value, yaml.ScalarNode):
            raise _at(value, f"header {name!r} must have one value")
        pairs.append((name.lower(), str(value.value)))
    return tuple(pairs)


def _arm(node: yaml.Node) -> ArmSpec:
    mapping = _mapping(node, "an arm")
    _known_keys(mapping, _ARM_KEYS, "an arm")
    name = _scalar(_required(mapping, "name", node))
    release = _scalar(_required(mapping, "release", node))
    share_node = _required(mapping, "share", node)
    share = _scalar(share_node)
    if not share.isdigit() or not 0 <= int(share) <= 100:
        raise _at(
            share_node, f"arm {name!r}: share must be a whole percent, 0 to 100, not {share!r}"
        )
    return ArmSpec(name, release, int(share), node.start_mark.line + 1)


def _mapping(node: yaml.Node | None, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _at(node, f"{what} must be a mapping")
    return {str(key.value): (key, value) for key, value in node.value}


def _known_keys(
    mapping: dict[str, tuple[yaml.Node, yaml.Node]], known: set[str], what: str
) -> None:
    for key, (key_node, _) in mapping.items():
        if key not in known:
            raise _at(
                key_node, f"unknown key {key!r} in {what} (known: {', '.join(sorted(known))})"
            )


def _required(
    mapping: dict[str, tuple[yaml.Node, yaml.Node]], key: str, owner: yaml.Node | None
) -> yaml.Node:
    if key not in mapping:
        raise _at(owner, f"`{key}` is missing")
    return mapping[key][1]


def _scalar(node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise _at(node, "expected a value")
    return str(node.value)


def _at(node: yaml.Node | None, message: str) -> ReefError:
    line = f" line {node.start_mark.line + 1}" if node is not None else ""
    return _refused(f"{POLICY_FILE}{line}: {message}")


def _refused(message: str) -> ReefError:
    return ReefError(message, status=400)
