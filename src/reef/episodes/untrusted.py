"""Files from outside: a task folder, and what an agent or a test wrote in its sandbox.

A task suite is someone else's folder (Harbor suites are downloaded), and the runner works as
root: a link in a task must never carry a host file into the sandbox, and a file the sandbox
wrote must never make the runner read a host file. So:

- `check_task_tree` refuses any link that is absolute or resolves outside the task folder, any
  hard link (its other names may lie anywhere), and anything that is not a file, a folder or
  such a link; `read_task_file` reads a task's own file (instruction.md, task.toml) only when it
  is a plain file of the task.
- `copy_task_folder` copies without following links, as the episode's own uid where there is
  one (the source and destination are handed over as open folders, so only what that uid may
  read is copied).
- `read_sandbox_file` reads what a sandbox wrote (the reward, the trajectory) without following
  a link at any step below a folder the runner made, as a regular file of bounded size.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

TASK_FILE_BYTES = 1_000_000  # instruction.md, task.toml


class UnsafePath(ValueError):
    """A path in a task or a sandbox that the runner refuses; the message names it and why."""


def check_task_tree(folder: Path, task_root: Path) -> None:
    """Every entry under `folder` is a plain file, a folder, or a relative link that stays in
    `task_root`; `UnsafePath` naming the first that is not. A missing `folder` is fine."""
    if not os.path.lexists(folder):
        return
    check_own_entry(folder, task_root, folder_expected=True)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            check_own_entry(Path(dirpath) / name, task_root)


def check_own_entry(path: Path, task_root: Path, folder_expected: bool = False) -> None:
    """`path` is a plain file, a folder, or a relative link inside `task_root`."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        if folder_expected:
            raise UnsafePath(f"{path}: a link; this folder must be a folder of the task itself")
        _check_link(path, task_root)
    elif stat.S_ISREG(info.st_mode):
        if info.st_nlink > 1:
            raise UnsafePath(
                f"{path}: a hard link (its other names may lie outside the task); "
                "make it a copy of its own"
            )
    elif not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path}: not a file, folder or link (a device, pipe or socket)")


def _check_link(path: Path, task_root: Path) -> None:
    target = os.readlink(path)
    if os.path.isabs(target):
        raise UnsafePath(
            f"{path}: a link to {target}; links in a task must be relative and stay inside it"
        )
    resolved = Path(os.path.realpath(path))
    if not resolved.is_relative_to(task_root):
        raise UnsafePath(f"{path}: a link that leads outside the task folder ({target})")


def read_task_file(path: Path, task_root: Path) -> str:
    """A task's own file: a plain file inside `task_root`, no link, at most 1 MB."""
    check_own_entry(path.parent, task_root, folder_expected=True)
    try:
        data = _read_regular(os.open(path, _READ_FLAGS), TASK_FILE_BYTES)
    except OSError as error:
        raise UnsafePath(f"{path}: {_why(error)}") from None
    check_own_entry(path, task_root)
    return data.decode(errors="replace")


def copy_task_folder(source: Path, destination: Path, uid: int | None) -> None:
    """`source`'s contents into `destination` (made and owned by `uid` beforehand), links
    copied as links, as `uid` when there is one; `UnsafePath` when the copy fails."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        source_fd = os.open(source, flags)
    except OSError as error:
        raise UnsafePath(f"{source}: {_why(error)}") from None
    destination_fd = os.open(destination, flags)
    try:
        command = ["cp", "-R", "--no-dereference", "--preserve=mode,timestamps,links"]
        command += [f"/proc/self/fd/{source_fd}/.", f"/proc/self/fd/{destination_fd}/"]
        if uid is not None:
            command = [*as_uid(uid), *command]
        done = subprocess.run(
            command,
            pass_fds=(source_fd, destination_fd),
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        os.close(source_fd)
        os.close(destination_fd)
    if done.returncode != 0:
        detail = done.stderr.strip().replace(f"/proc/self/fd/{source_fd}", str(source))
        raise UnsafePath(
            f"{source}: cannot copy it as the episode's user ({detail[:300]}); every file of a "
            "task's environment must be readable by others (chmod -R o+rX it)"
        )


def as_uid(uid: int) -> list[str]:
    """The command prefix that runs the rest as `uid`, with no groups and no capabilities."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def read_sandbox_file(base: Path, relative: str, limit: int) -> bytes | None:
    """The file at `base/relative`, written by a sandbox: None when it is absent; `UnsafePath`
    when any step below `base` is a link, or it is not a regular file, or it is over `limit`
    bytes. `base` itself is a folder the runner made, which the sandbox cannot replace."""
    parts = Path(relative).parts
    try:
        folder = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _READ_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = below
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UnsafePath(f"{relative}: {_why(error)}") from None
    finally:
        os.close(folder)
    try:
        return _read_regular(fd, limit)
    except OSError as error:
        raise UnsafePath(f"{relative}: {_why(error)}") from None


# O_NONBLOCK: a named pipe in the sandbox's place of a file must not hang the runner.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read_regular(fd: int, limit: int) -> bytes:
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EISDIR, "not a regular file")
        if info.st_size > limit:
            raise OSError(0, f"larger than {limit} bytes")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(0, f"larger than {limit} bytes")
    return data


def _why(error: OSError) -> str:
    if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link
        return "a link, not a file"
    if error.errno in (errno.ENOTDIR, errno.EISDIR):
        return "not a regular file"
    return error.strerror or str(error)
