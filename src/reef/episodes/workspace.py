"""The episode's folder on the host, the only place its sandboxes write.

    <episode>/app            /app for the agent, then for the verifier (handed over to it)
    <episode>/logs           /logs for the agent (agent/: instruction, trajectory)
    <episode>/home, tmp      the agent's /home/agent and /tmp
    <episode>/verifier/      the verifier's own /logs/verifier, /home/agent and /tmp, made
                             after the agent's run: nothing in them was the agent's
    <episode>/etc            the sandbox's passwd, group and hosts, read-only inside (the
                             verifier's in verifier/etc)

As root the folder is a tmpfs of its own sized to the disk limit, so that a file the agent
deleted while holding it open still counts, and the agent and the verifier each run as a uid
of their own. The folder is its owner's alone (0700): a kept workspace holds the episode's
token in the agent's files until it expires.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from reef.episodes.untrusted import check_task_tree, copy_task_folder

INSIDE_UID = 1000
SANDBOX_UIDS = (200_000, 260_000)  # as root: the range each run's own uid is drawn from
FULL_BYTES = 64 * 1024  # a capped workspace with less room than this is at its disk limit
# A capped workspace's inodes: 64 a MiB of its disk limit (a kept copy then takes at most about
# 4 KiB each on the host, a quarter of the limit again), and never fewer than an environment's.
INODES_PER_MB = 64
MIN_INODES = 4096
FULL_INODES = 16  # a capped workspace with fewer inodes left than this is at its disk limit
Role = Literal["agent", "verifier"]


@dataclass(frozen=True)
class Workspace:
    """The episode's folder, as one of its two runs sees it: the agent's or the verifier's."""

    root: Path
    uid: int | None = None  # the uid this run's sandbox runs as (root only)
    role: Role = "agent"
    capped: bool = False  # a tmpfs of the disk limit's size

    @property
    def app(self) -> Path:
        return self.root / "app"

    @property
    def logs(self) -> Path:
        """The agent's /logs."""
        return self.root / "logs"

    @property
    def verifier_logs(self) -> Path:
        return self.root / "verifier" / "logs"

    @property
    def home(self) -> Path:
        return self._own("home")

    @property
    def tmp(self) -> Path:
        return self._own("tmp")

    @property
    def etc(self) -> Path:
        """This run's passwd, group and hosts."""
        return self._own("etc")

    def writable(self) -> list[Path]:
        """This run's writable folders."""
        logs = self.logs if self.role == "agent" else self.verifier_logs
        return [self.app, logs, self.home, self.tmp]

    def writable_binds(self) -> dict[str, Path]:
        """Inside -> host, for this run's writable folders (the verifier sees no agent log)."""
        if self.role == "agent":
            logs = {"/logs": self.logs}
        else:
            logs = {"/logs/verifier": self.verifier_logs}
        return {"/app": self.app, **logs, "/home/agent": self.home, "/tmp": self.tmp}

    def for_verifier(self) -> Workspace:
        """The verifier's view, made now: fresh logs, home and tmp, a uid of its own, and /app
        handed over to that uid (the agent's processes are gone by then), its git
        repositories defanged first (`defang_git`): what the agent left is data, not code."""
        uid = None if self.uid is None else _other_uid(self.uid)
        verifier = replace(self, uid=uid, role="verifier")
        for folder in [*verifier.writable(), verifier.etc]:
            folder.mkdir(parents=True, exist_ok=True)
        _write_etc(verifier)
        defang_git(verifier.app)
        give_to_sandbox(verifier)
        return verifier

    def _own(self, name: str) -> Path:
        return self.root / name if self.role == "agent" else self.root / "verifier" / name


def create_workspace(
    root: Path, environment: Path | None = None, disk_mb: int | None = None
) -> Workspace:
    """A fresh workspace at `root`, /app holding `environment`'s files but its Dockerfile
    (copied without following a link, as the agent's uid; `environment` is checked again
    first, as it may have changed since the task was loaded)."""
    root.mkdir(mode=0o700, parents=True)
    root.chmod(0o700)
    uid = random.randrange(*SANDBOX_UIDS) if os.geteuid() == 0 else None
    capped = uid is not None and disk_mb is not None and _mount_tmpfs(root, disk_mb)
    workspace = Workspace(root=root, uid=uid, capped=capped)
    try:
        _fill(workspace, environment)
    except BaseException:
        release_workspace(workspace, keep=False)
        raise
    return workspace


def _fill(workspace: Workspace, environment: Path | None) -> None:
    for folder in [*workspace.writable(), workspace.etc]:
        folder.mkdir(parents=True, exist_ok=True)
    for sub in ("agent", "verifier"):
        (workspace.logs / sub).mkdir(exist_ok=True)
    _write_etc(workspace)
    give_to_sandbox(workspace)
    if environment is None or not environment.is_dir():
        return
    check_task_tree(environment, environment.parent)
    copy_task_folder(environment, workspace.app, workspace.uid)
    for name in ("Dockerfile", ".dockerignore"):
        dropped = workspace.app / name
        if dropped.is_file() and not dropped.is_symlink():
            dropped.unlink()


# What a repository's config may say when the verifier's git reads it: nothing that runs a
# program (hooks, fsmonitor, filter and diff drivers, a pager, an editor, an ssh command).
SAFE_GIT_CONFIG = b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
MAX_REPOSITORIES = 64  # .git folders defanged in one /app; more is an attack, and all go


def defang_git(app: Path) -> None:
    """Make every git repository the agent left in `app` data: its config replaced by one that
    names no program, its hooks removed, and a `.git` file (a pointer to a repository
    elsewhere) removed; links are removed, never followed. The verifier's own git is also told
    to trust no config but the task's (`reef.episodes.runner.VERIFIER_ENV`)."""
    found = 0
    for dirpath, dirnames, filenames in os.walk(app):
        if ".git" in filenames:
            os.unlink(os.path.join(dirpath, ".git"))
        if ".git" not in dirnames:
            continue
        repository = Path(dirpath) / ".git"
        found += 1
        if repository.is_symlink() or found > MAX_REPOSITORIES:
            _remove(repository)
            continue
        # Each is an entry of the repository itself, never reached through one of its folders
        # (`info` may be a link to a host folder: it goes whole, as a link).
        for name in ("config", "hooks", "info", "config.worktree", "commondir"):
            _remove(repository / name)
        descriptor = os.open(repository / "config", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "wb") as config:
            config.write(SAFE_GIT_CONFIG)
        (repository / "hooks").mkdir()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def give_to_sandbox(workspace: Workspace) -> None:
    """The run's writable folders, owned by its uid (links themselves, never what they name)."""
    if workspace.uid is None:
        return
    for folder in workspace.writable():
        os.lchown(folder, workspace.uid, workspace.uid)
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, name), workspace.uid, workspace.uid)


def at_disk_limit(workspace: Workspace) -> bool:
    """Whether a capped workspace is full, of bytes or of inodes (the kernel refuses its next
    write, or its next file)."""
    if not workspace.capped:
        return False
    stats = os.statvfs(workspace.root)
    return stats.f_bavail * stats.f_frsize < FULL_BYTES or stats.f_favail < FULL_INODES


def release_workspace(workspace: Workspace, keep: bool) -> None:
    """Unmount a capped workspace (its files copied to a plain folder of the same name first
    when it is kept), or remove it when it is not kept."""
    if workspace.capped:
        kept = workspace.root.with_name(workspace.root.name + ".kept")
        if keep:
            kept.mkdir(mode=0o700)
            subprocess.run(["cp", "-a", f"{workspace.root}/.", f"{kept}/"], check=False)
        subprocess.run(["umount", "--lazy", str(workspace.root)], check=False)
        workspace.root.rmdir()
        if keep:
            kept.rename(workspace.root)
        return
    if not keep:
        shutil.rmtree(workspace.root, ignore_errors=True)


def inode_budget(disk_mb: int) -> int:
    """The files, folders and links a capped workspace may hold: a tiny file takes no block of
    tmpfs but an inode, and 4 KiB on the host's disk when the workspace is kept (issue 74:
    60,000 of them used 16 KiB of a 16 MiB tmpfs, and 167 MB kept)."""
    return max(MIN_INODES, disk_mb * INODES_PER_MB)


def _mount_tmpfs(root: Path, disk_mb: int) -> bool:
    options = f"size={disk_mb}m,nr_inodes={inode_budget(disk_mb)},mode=0700"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)], capture_output=True
    )
    return done.returncode == 0


def _write_etc(workspace: Workspace) -> None:
    agent = inside_uid(workspace)
    (workspace.etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\nagent:x:{agent}:{agent}::/home/agent:/bin/bash\n"
    )
    (workspace.etc / "group").write_text(f"root:x:0:\nagent:x:{agent}:\n")
    (workspace.etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")


def inside_uid(workspace: Workspace) -> int:
    return INSIDE_UID if workspace.uid is None else workspace.uid


def _other_uid(uid: int) -> int:
    while (other := random.randrange(*SANDBOX_UIDS)) == uid:
        continue
    return other
