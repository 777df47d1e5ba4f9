"""Routing policies (`routing.yaml`) read and checked with the line of each mistake, arms chosen by
session, and the canary's posterior test on synthetic reports."""

from __future__ import annotations

from collections import Counter

import pytest

from reef.config import CanaryConfig
from reef.errors import ReefError
from reef.inference.routing import Arm, Routing, canary_policy, check_policy, parse_policy
from reef.releases.canary import judge

SPLIT = """\
routes:
  - when: {headers: {x-user-tier: beta}}
    arms:
      - {name: canary, release: self, share: 100}
  - arms:
      - {name: stable, release: default@3, share: 80}
      - {name: canary, release: self, share: 20}
"""


A_100 = "      - {name: a, release: self, share: 100}\n"
OPEN = "  - arms:\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f"routes:\n{OPEN}      - {{name: a, release: self, share: 60}}\n",
            "line 3: the arms' shares sum to 60, not 100",
        ),
        (
            f"routes:\n{OPEN}      - {{name: a, release: self, share: 50.5}}\n",
            "line 3: arm 'a': share must be a whole percent",
        ),
        (
            f"routes:\n  - when: {{user: x}}\n    arms:\n{A_100}{OPEN}{A_100}",
            "line 2: unknown condition 'user'",
        ),
        (
            f"routes:\n{OPEN}      - {{name: a, release: self, share: 100, weight: 2}}\n",
            "line 3: unknown key 'weight' in an arm",
        ),
        (
            f"routes:\n  - when: {{headers: {{x-a: b}}}}\n    arms:\n{A_100}",
            "line 2: the last route must have no `when`",
        ),
        (f"routes:\n{OPEN}{A_100}{OPEN}{A_100}", "line 2: only the last route may have no `when`"),
        (
            f"routes:\n{OPEN}      - {{name: a, release: self, share: 50}}\n"
            "      - {name: a, release: base, share: 50}\n",
            "line 3: two arms of one route share a name",
        ),
        ("arms: []\n", "line 1: unknown key 'arms' in the policy"),
        ("routes: []\nroutes: []\n", "line 2: routes is set twice (first at line 1)"),
        ("routes: [\n", "not valid YAML"),
    ],
)
def test_a_policy_that_cannot_route_is_refused_naming_its_line(text: str, message: str) -> None:
    with pytest.raises(ReefError, match=r"routing\.yaml") as refused:
        parse_policy(text)
    assert message in refused.value.message


def test_an_arm_on_a_release_that_does_not_exist_is_refused_naming_its_line() -> None:
    with pytest.raises(ReefError) as refused:
        check_policy(SPLIT, lambda release_id: False)
    assert refused.value.message == (
        "routing.yaml line 6: arm 'stable': there is no release 'default@3'"
    )
    assert check_policy(SPLIT, lambda release_id: release_id == "default@3")


def routing(text: str) -> Routing:
    routes = parse_policy(text)
    return Routing(
        "default@4",
        tuple(
            (route, tuple(Arm(a.name, a.share, a.release) for a in route.arms)) for route in routes
        ),
    )


def test_a_session_keeps_its_arm_and_sessions_split_by_the_shares() -> None:
    policy = routing(SPLIT)
    arms = {f"s{n}": policy.choose({}, f"s{n}").name for n in range(2000)}
    assert all(policy.choose({}, session).name == arm for session, arm in arms.items())
    share = Counter(arms.values())["canary"] / len(arms)
    assert 0.17 < share < 0.23  # 20%, by a hash
    beta = {"x-user-tier": "beta"}
    assert {policy.choose(beta, f"s{n}").name for n in range(50)} == {"canary"}


def test_a_canary_policy_routes_its_share_to_the_release_itself() -> None:
    routes = parse_policy(canary_policy("default@3", 10).decode())
    assert [(a.name, a.release, a.share) for a in routes[0].arms] == [
        ("stable", "default@3", 90),
        ("canary", "self", 10),
    ]


SETTINGS = CanaryConfig(min_reports=20, margin=0.1, confidence=0.95, deadline_s=600)


def test_too_few_reports_wait_until_the_deadline_decides() -> None:
    scores = {"stable": [1.0] * 30, "canary": [0.0] * 5}
    assert judge(SETTINGS, scores, age_s=10).action == "wait"
    late = judge(SETTINGS, scores, age_s=601)
    assert late.action == "rollback" and "deadline" in late.why


def test_a_worse_canary_is_rolled_back_and_an_equal_one_promoted() -> None:
    worse = judge(SETTINGS, {"stable": [1.0, 0.0] * 25, "canary": [0.0] * 49 + [1.0]}, age_s=5)
    assert worse.action == "rollback" and "worse, rolled back" in worse.why
    assert worse.interval is not None and worse.interval[1] < -SETTINGS.margin
    # 0/1 scores around 0.5: telling a 0.1 difference apart at 95%, at every look, takes about
    # 460 reports an arm.
    equal = judge(SETTINGS, {"stable": [1.0, 0.0] * 240, "canary": [0.0, 1.0] * 240}, age_s=5)
    assert equal.action == "promote" and equal.difference == 0
    assert equal.interval is not None and equal.interval[0] > -SETTINGS.margin
    unsure = judge(SETTINGS, {"stable": [1.0, 0.0] * 100, "canary": [0.0, 1.0] * 100}, age_s=5)
    assert unsure.action == "wait"  # 200 reports each cannot tell a 0.1 difference apart
