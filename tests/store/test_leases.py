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


def test_a_new_holder_bumps_the_generation_and_fences_the_old_one(store: ExperienceStore) -> None:
    """The lease is a fence: a holder whose lease expired and was taken over cannot confirm
    its old generation (its publish is refused), and a given-up lease's generation goes on."""
    import pytest

    from reef.store.leases import LeaseLost, confirm_lease

    old, new = new_holder(), new_holder()
    first = take_lease(store, "learner:default", old, period_s=0.3)
    assert first >= 1
    assert take_lease(store, "learner:default", old, period_s=0.3) == first  # a renewal
    confirm_lease(store, "learner:default", old, first, period_s=0.3)
    time.sleep(0.4)  # paused past its lease (a long push)
    second = take_lease(store, "learner:default", new, period_s=60)
    assert second == first + 1
    with pytest.raises(LeaseLost):
        confirm_lease(store, "learner:default", old, first, period_s=60)
    confirm_lease(store, "learner:default", new, second, period_s=60)
    give_up_lease(store, "learner:default", new)
    assert take_lease(store, "learner:default", old, period_s=60) == second + 1
