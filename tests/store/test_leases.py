"""Leases on both databases: one holder at a time, renewed by its holder, taken over after it
expires, given up at once on a clean stop."""

from __future__ import annotations

import time

from reef.store import ExperienceStore
from reef.store.leases import give_up_lease, lease_holders, new_holder, take_lease


def test_one_holder_at_a_time_until_its_lease_expires(store: ExperienceStore) -> None:
    first, second = new_holder(), new_holder()
    assert first != second
    assert take_lease(store, "learner:default", first, period_s=0.6)
    assert not take_lease(store, "learner:default", second, period_s=0.6)
    assert take_lease(store, "learner:other", second, period_s=0.6)  # another job, another lease
    time.sleep(0.3)
    assert take_lease(store, "learner:default", first, period_s=0.6)  # renewed: 0.6 s from now
    time.sleep(0.4)
    assert not take_lease(store, "learner:default", second, period_s=0.6)  # not expired yet
    held = lease_holders(store)
    assert held["learner:default"]["holder"] == first
    assert 0 < float(held["learner:default"]["left_s"]) <= 0.6
    time.sleep(0.3)  # the first holder stopped renewing
    assert take_lease(store, "learner:default", second, period_s=0.6)
    assert not take_lease(store, "learner:default", first, period_s=0.6)


def test_a_lease_given_up_is_taken_at_once_and_only_by_its_holder(store: ExperienceStore) -> None:
    first, second = new_holder(), new_holder()
    assert take_lease(store, "learner:default", first, period_s=60)
    give_up_lease(store, "learner:default", second)  # not its lease: nothing happens
    assert not take_lease(store, "learner:default", second, period_s=60)
    give_up_lease(store, "learner:default", first)
    assert take_lease(store, "learner:default", second, period_s=60)
    assert lease_holders(store)["learner:default"]["holder"] == second
