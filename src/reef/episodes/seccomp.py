"""No user namespaces inside the sandbox: a seccomp filter bubblewrap loads before the agent runs.

Run as root, bubblewrap sets the sandbox up in the host's user namespace and `as_uid` drops to
the agent's uid; where the kernel lets unprivileged users make user namespaces, the agent could
then `unshare -Ur` and be root of a namespace of its own, mounting what it likes (issue 74: a
tmpfs of 600 MiB under `memory = "128M"`). Run as anyone else, bubblewrap's `--disable-userns`
closes that door; as root it cannot (it needs a user namespace of its own). So every sandbox
gets this filter (`bwrap --seccomp FD`): `unshare` and `clone` asking for `CLONE_NEWUSER` fail
with EPERM, and `clone3`, whose flags a filter cannot read (they are in memory), fails with
ENOSYS, which makes the C library fall back to `clone` for threads and processes. Syscalls of
another ABI than the machine's (x32 on x86-64, 32-bit calls) are refused outright, so none
of them slips past the numbers below.

The program is classic BPF over `struct seccomp_data` (nr at 0, arch at 4, args from 16), in
the binary form `seccomp_export_bpf` writes and bubblewrap reads: 8 bytes an instruction.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

from reef.errors import ReefError

CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
# Per machine: the audit arch seccomp reports, and the numbers of unshare, clone and clone3.
ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}

# Classic BPF opcodes (linux/bpf_common.h) and seccomp's return values (linux/seccomp.h).
LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JUMP_ANY_BIT = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RETURN = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
ERRNO = 0x00050000
KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS

NR, ARCH, FIRST_ARGUMENT = 0, 4, 16  # offsets in struct seccomp_data (little-endian low word)


class SeccompUnavailable(ReefError):
    status = 500
    code = "sandbox_unavailable"


def _op(code: int, k: int, true: int = 0, false: int = 0) -> bytes:
    return struct.pack("<HBBI", code, true, false, k)


def no_user_namespaces(machine: str | None = None) -> bytes:
    """The filter for this machine (`platform.machine()`), as bubblewrap reads it."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SeccompUnavailable(
            f"episodes cannot keep user namespaces out of the sandbox on {machine} (Reef knows "
            f"the system calls of {', '.join(ARCHES)}): run episodes on one of those machines"
        )
    arch, unshare, clone, clone3 = ARCHES[machine]
    program = [
        _op(LOAD_WORD, ARCH),
        _op(JUMP_EQUAL, arch, 1, 0),  # another ABI (32-bit calls): killed
        _op(RETURN, KILL),
        _op(LOAD_WORD, NR),
        _op(JUMP_AT_LEAST, X32_SYSCALL_BIT, 7, 0),  # x32's numbers: refused
        _op(JUMP_EQUAL, clone3, 7, 0),
        _op(JUMP_EQUAL, unshare, 1, 0),
        _op(JUMP_EQUAL, clone, 0, 2),
        _op(LOAD_WORD, FIRST_ARGUMENT),  # the flags, for both
        _op(JUMP_ANY_BIT, CLONE_NEWUSER, 1, 0),
        _op(RETURN, ALLOW),
        _op(RETURN, ERRNO | errno.EPERM),
        _op(RETURN, ERRNO | errno.EPERM),  # x32
        _op(RETURN, ERRNO | errno.ENOSYS),  # clone3
    ]
    return b"".join(program)


def filter_fd() -> int:
    """A file descriptor holding the filter at offset 0, for `bwrap --seccomp FD` (the caller
    passes it to bubblewrap and closes it)."""
    descriptor = os.memfd_create("reef-seccomp", 0)  # inheritable: bubblewrap reads it
    os.write(descriptor, no_user_namespaces())
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor
