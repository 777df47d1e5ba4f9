"""The sandbox's seccomp filter, as bytes: one 8-byte instruction each, the machine's syscall
numbers in it, and a machine Reef does not know refused in a sentence (the filter at work is
tests/e2e/episodes/test_hostile_agents.py, an agent calling unshare)."""

from __future__ import annotations

import struct

import pytest

from reef.episodes.seccomp import ARCHES, CLONE_NEWUSER, SeccompUnavailable, no_user_namespaces


@pytest.mark.parametrize("machine", list(ARCHES))
def test_the_filter_names_the_machine_and_its_namespace_calls(machine: str) -> None:
    program = no_user_namespaces(machine)
    assert len(program) % 8 == 0
    constants = {struct.unpack_from("<HBBI", program, at)[3] for at in range(0, len(program), 8)}
    arch, unshare, clone, clone3 = ARCHES[machine]
    assert {arch, unshare, clone, clone3, CLONE_NEWUSER} <= constants


def test_a_machine_reef_does_not_know_refuses_episodes_in_a_sentence() -> None:
    with pytest.raises(SeccompUnavailable, match=r"on riscv64 .* x86_64, aarch64"):
        no_user_namespaces("riscv64")
