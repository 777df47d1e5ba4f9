"""A task folder is untrusted input: each of these tasks tries to carry a host file into the
sandbox (or to the model as its instruction), and is refused with the path that is wrong.

The canary is a host file the runner (root) can read and the sandbox must never see: a stand-in
for `~/.git-credentials`, the server's `reef.yaml` or its `.reef/` folder."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from reef.episodes.tasks import BadTask, load_suite, load_task, task_folder_hash
from reef.episodes.untrusted import UnsafePath
from reef.episodes.workspace import create_workspace

CANARY = "canary-credential-3f9a"


def make_task(folder: Path) -> Path:
    """A well-formed task: instruction, test, one environment file."""
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "data.txt").write_text("data\n")
    (folder / "tests").mkdir()
    test = folder / "tests" / "test.sh"
    test.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    test.chmod(0o755)
    (folder / "task.toml").write_text("[agent]\ntimeout_sec = 30\n")
    (folder / "instruction.md").write_text("Do the thing.\n")
    return folder


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    secret = tmp_path / "host" / ".git-credentials"
    secret.parent.mkdir()
    secret.write_text(f"https://user:{CANARY}@example.com\n")
    return secret


def link(path: Path, target: str | Path) -> None:
    if path.exists() or path.is_symlink():
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
        else:
            path.unlink()
    path.symlink_to(target)


def outside_tests(host: Path) -> Path:
    """A tests folder outside the task, whose test the sandbox would run with /tests bound."""
    tests = host / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text("#!/bin/bash\ncat /tests/../.git-credentials\n")
    (tests / "test.sh").chmod(0o755)
    return tests


ATTACKS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "environ": (
        lambda task, _: link(task / "environment" / "runner_env", "/proc/self/environ"),
        "environment/runner_env: a link to /proc/self/environ",
    ),
    "state folder": (
        lambda task, _: link(task / "environment" / "cwd_state", "/proc/self/cwd/.reef"),
        "environment/cwd_state: a link to /proc/self/cwd/.reef",
    ),
    "server config": (
        lambda task, _: link(task / "environment" / "cwd_yaml", "/proc/self/cwd/reef.yaml"),
        "environment/cwd_yaml: a link to /proc/self/cwd/reef.yaml",
    ),
    "instruction": (
        lambda task, secret: link(task / "instruction.md", secret),
        "instruction.md: a link, not a file",
    ),
    "relative way out": (
        lambda task, secret: link(
            task / "environment" / "up", os.path.relpath(secret, task / "environment")
        ),
        "environment/up: a link that leads outside the task folder",
    ),
    "environment folder": (
        lambda task, secret: link(task / "environment", os.path.relpath(secret.parent, task)),
        "environment: a link; this folder must be a folder of the task itself",
    ),
    "tests folder": (
        lambda task, secret: link(task / "tests", outside_tests(secret.parent)),
        "tests: a link; this folder must be a folder of the task itself",
    ),
    "solution folder": (
        lambda task, secret: link(task / "solution", secret.parent),
        "solution: a link; this folder must be a folder of the task itself",
    ),
    "hard link": (
        lambda task, secret: os.link(secret, task / "environment" / "creds"),
        "environment/creds: a hard link",
    ),
    "fifo": (
        lambda task, _: os.mkfifo(task / "environment" / "pipe"),
        "environment/pipe: not a file, folder or link",
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_task_that_leads_out_of_its_folder_is_refused_naming_the_path(
    tmp_path: Path, canary: Path, attack: str
) -> None:
    task = make_task(tmp_path / "suite" / "hostile")
    plant, message = ATTACKS[attack]
    plant(task, canary)
    with pytest.raises(BadTask) as refused:
        load_task(task)
    assert message in str(refused.value)
    assert CANARY not in str(refused.value)
    with pytest.raises(BadTask):
        load_suite(tmp_path / "suite")


def test_links_inside_the_task_are_copied_as_links(tmp_path: Path) -> None:
    task = make_task(tmp_path / "task")
    (task / "environment" / "alias").symlink_to("data.txt")
    (task / "environment" / "deeper").mkdir()
    (task / "environment" / "deeper" / "up").symlink_to("../data.txt")
    loaded = load_task(task)
    workspace = create_workspace(tmp_path / "ws", loaded.environment)
    assert os.readlink(workspace.app / "alias") == "data.txt"
    assert (workspace.app / "deeper" / "up").read_text() == "data\n"


def test_a_link_added_after_loading_is_refused_at_the_copy(tmp_path: Path, canary: Path) -> None:
    task = load_task(make_task(tmp_path / "task"))
    (task.environment / "late").symlink_to("/proc/self/environ")
    with pytest.raises(UnsafePath, match="environment/late: a link to /proc/self/environ"):
        create_workspace(tmp_path / "ws", task.environment, disk_mb=16)
    assert not (tmp_path / "ws").exists()  # nothing left mounted or copied


@pytest.mark.skipif(os.geteuid() != 0, reason="the copy runs as the episode's uid as root only")
def test_the_copy_runs_as_the_episode_s_user_and_reads_only_what_it_may(tmp_path: Path) -> None:
    task = make_task(tmp_path / "task")
    private = task / "environment" / "private.txt"
    private.write_text(CANARY)
    private.chmod(0o600)  # root's alone: the episode's uid cannot read it
    with pytest.raises(UnsafePath, match="readable by others"):
        create_workspace(tmp_path / "ws", task / "environment")
    private.chmod(0o644)
    workspace = create_workspace(tmp_path / "ws2", task / "environment")
    assert (workspace.app / "private.txt").stat().st_uid == workspace.uid
    assert stat.S_IMODE(workspace.root.stat().st_mode) == 0o700


def test_a_suite_s_task_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = make_task(tmp_path / "elsewhere")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "linked").symlink_to(elsewhere)
    with pytest.raises(BadTask, match="linked: a link"):
        load_suite(tmp_path / "suite")


def test_a_link_or_a_fifo_beside_the_task_s_folders_is_refused_and_never_hashed(
    tmp_path: Path, canary: Path
) -> None:
    """Links at the task's root were not checked, and the gate's task hash read through them
    as root (and would wait forever on a FIFO there)."""
    task = make_task(tmp_path / "leaky")
    link(task / "notes.md", canary)
    with pytest.raises(BadTask, match=r"notes\.md"):
        load_task(task)
    (task / "notes.md").unlink()
    os.mkfifo(task / "pipe")
    with pytest.raises(BadTask, match="pipe"):
        load_task(task)
    (task / "pipe").unlink()
    loaded = load_task(task)
    before = task_folder_hash(loaded)
    # Added after loading: the hash says what the link says, and reads neither it nor a FIFO.
    link(task / "notes.md", canary)
    os.mkfifo(task / "pipe")
    linked = task_folder_hash(loaded)
    canary.write_text("another secret\n")
    assert task_folder_hash(loaded) == linked != before
