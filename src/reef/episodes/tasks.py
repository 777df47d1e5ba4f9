"""Tasks in Harbor's format (the task standard of Terminal-Bench): one folder each.

    task.toml            [metadata], [agent] timeout_sec, [verifier] timeout_sec,
                         [environment] cpus, memory (or memory_mb)
    instruction.md       what the agent is asked to do
    environment/         a Dockerfile and the files the task starts with (copied into /app)
    tests/test.sh        executable; writes the reward to /logs/verifier/reward.txt (or .json)
    solution/solve.sh    optional: the oracle, which shows the test can pass

There is no Docker here: a task runs over the host's tools, so a Dockerfile that installs
packages (`RUN apt-get install …`, `RUN pip install …`) is reported as needing its image.

A task is untrusted input: a link that leaves the task folder, a hard link, or a device in it
is refused with its path (reef.episodes.untrusted).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.episodes.untrusted import UnsafePath, check_task_tree, read_task_file

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
# A RUN line that installs packages the host may lack.
INSTALLS = re.compile(
    r"\b(apt-get|apt|apk|yum|dnf|microdnf|zypper)\s+(-\S+\s+)*install\b"
    r"|\b(pip3?|uv\s+pip|npm|pnpm|yarn|gem|cargo|go)\s+(-\S+\s+)*(install|add|get)\b"
    r"|\bconda\s+install\b"
)


class BadTask(ValueError):
    """A task folder that does not follow Harbor's format; the message names path and fix."""


@dataclass(frozen=True)
class Task:
    path: Path
    name: str
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    cpus: float | None = None
    memory_mb: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # RUN lines of the Dockerfile that install packages: the task needs its image.
    image_installs: tuple[str, ...] = ()

    @property
    def environment(self) -> Path:
        return self.path / "environment"

    @property
    def tests(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> Path | None:
        solve = self.path / "solution" / "solve.sh"
        return solve if solve.is_file() else None

    @property
    def group(self) -> str:
        """The task's group for a gate's group rules: metadata.category, else its name."""
        return str(self.metadata.get("category") or self.name)

    @property
    def needs_image(self) -> bool:
        return bool(self.image_installs)


def load_task(folder: Path | str) -> Task:
    """The task in `folder`; `BadTask` naming the path and what is missing or wrong."""
    path = Path(folder).resolve()
    if not path.is_dir():
        raise BadTask(f"{path}: not a folder (a task is a folder with task.toml)")
    config = _task_toml(path)
    instruction = _required_file(path, "instruction.md", "the instruction given to the agent")
    test = path / "tests" / "test.sh"
    _required_file(path, "tests/test.sh", "the test that writes /logs/verifier/reward.txt")
    if not os.access(test, os.X_OK):
        raise BadTask(f"{test}: not executable (chmod +x it)")
    check_task_folders(path)
    environment = config.get("environment", {})
    return Task(
        path=path,
        name=path.name,
        instruction=instruction,
        agent_timeout_s=_seconds(config, "agent", DEFAULT_AGENT_TIMEOUT_S, path),
        verifier_timeout_s=_seconds(config, "verifier", DEFAULT_VERIFIER_TIMEOUT_S, path),
        cpus=_number(environment.get("cpus"), "environment.cpus", path, most_cpus()),
        memory_mb=_memory_mb(environment, path),
        metadata=dict(config.get("metadata", {})),
        image_installs=installing_lines(path / "environment" / "Dockerfile"),
    )


def load_suite(folder: Path | str) -> list[Task]:
    """Every task under `folder` (its subfolders holding task.toml), by name; `folder` may be
    one task itself."""
    root = Path(folder).resolve()
    if (root / "task.toml").is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise BadTask(f"{root}: not a folder of tasks")
    tasks = [task for child in sorted(root.iterdir()) if (task := _suite_task(child)) is not None]
    if not tasks:
        raise BadTask(f"{root}: no task here (no subfolder has a task.toml)")
    return tasks


def _suite_task(child: Path) -> Task | None:
    if not (child / "task.toml").exists():
        return None
    if child.is_symlink():
        raise BadTask(f"{child}: a link; a suite's tasks must be folders of the suite itself")
    return load_task(child)


def check_task_folders(path: Path) -> None:
    """The whole task folder (what the sandbox is given of it, environment/, tests/,
    solution/, and what lies beside them, which the gate's task hash reads) holds nothing that
    leads out of it, and nothing but files, folders and links within it; `BadTask` naming the
    first entry that does. The runner checks again before each episode: the folder may change
    between loading and running."""
    try:
        for name in ("environment", "tests", "solution"):  # each must be a folder, not a link
            check_task_tree(path / name, path)
        check_task_tree(path, path)
    except UnsafePath as error:
        raise BadTask(str(error)) from None


def installing_lines(dockerfile: Path) -> tuple[str, ...]:
    """The Dockerfile's RUN instructions (continuations joined) that install packages."""
    if not dockerfile.is_file():
        return ()
    joined = re.sub(r"\\\n", " ", dockerfile.read_text(errors="replace"))
    runs = [line.strip() for line in joined.splitlines() if line.strip().upper().startswith("RUN")]
    return tuple(" ".join(run.split()) for run in runs if INSTALLS.search(run))


def _task_toml(path: Path) -> dict[str, Any]:
    toml = path / "task.toml"
    if not os.path.lexists(toml):
        raise BadTask(f"{toml}: missing (every task folder has a task.toml)")
    try:
        return tomllib.loads(_task_file(toml, path))
    except tomllib.TOMLDecodeError as error:
        raise BadTask(f"{toml}: not valid TOML ({error})") from None


def _required_file(task_root: Path, relative: str, what: str) -> str:
    path = task_root / relative
    if not os.path.lexists(path):
        raise BadTask(f"{path}: missing ({what})")
    return _task_file(path, task_root)


def _task_file(path: Path, task_root: Path) -> str:
    """A file of the task's own, never one a link leads to."""
    try:
        return read_task_file(path, task_root)
    except UnsafePath as error:
        raise BadTask(str(error)) from None


# The most a task may ask for: a number beyond these is refused, never passed to a cgroup that
# would refuse it (and then run the episode without the limit).
MAX_TIMEOUT_S = 24 * 3600.0
MAX_MEMORY_MB = 1024 * 1024  # 1 TiB


def most_cpus() -> float:
    """The most CPUs a task may ask for: this machine's."""
    return float(os.cpu_count() or 1)


def _seconds(config: dict[str, Any], section: str, default: float, path: Path) -> float:
    key = f"{section}.timeout_sec"
    value = _number(config.get(section, {}).get("timeout_sec"), key, path, MAX_TIMEOUT_S)
    return default if value is None else value


def _number(value: Any, key: str, path: Path, most: float) -> float | None:
    """A positive, finite number no larger than `most` (`nan`, `inf` and `1e9` CPUs are a
    hostile task's, refused with what is allowed)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise BadTask(
            f"{path / 'task.toml'}: {key} must be a positive, finite number, got {value!r}"
        )
    if value > most:
        raise BadTask(f"{path / 'task.toml'}: {key} is {value!r}; at most {most:g} here")
    return float(value)


def _memory_mb(environment: dict[str, Any], path: Path) -> int | None:
    """`memory_mb = 2048`, or Harbor's `memory = "2G"` (M or G)."""
    if "memory_mb" in environment:
        value = _number(environment["memory_mb"], "environment.memory_mb", path, MAX_MEMORY_MB)
        return None if value is None else int(value)
    memory = environment.get("memory")
    if memory is None:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([MmGg])[Bb]?\s*", str(memory))
    if not found:
        raise BadTask(f"{path / 'task.toml'}: environment.memory must be like '2G' or '512M'")
    size = float(found.group(1))
    megabytes = size * 1024 if found.group(2).lower() == "g" else size
    value = _number(megabytes, "environment.memory", path, MAX_MEMORY_MB)
    return None if value is None else int(value)


def task_folder_hash(task: Task) -> str:
    """What the task asks and how it is scored: its instruction, its files and its test. Links
    are hashed as what they say, never followed (a task is hostile: a link could lead the
    runner, as root, to any file of the host, or a FIFO hang it)."""
    digest = hashlib.sha256()
    for path in _task_entries(task.path):
        relative = path.relative_to(task.path)
        if "solution" in relative.parts:
            continue
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            digest.update(str(relative).encode() + b"\0link:")
            digest.update(os.fsencode(os.readlink(path)) + b"\0")
        elif stat.S_ISREG(info.st_mode):
            digest.update(str(relative).encode() + b"\0")
            _hash_file(digest, path)
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def _hash_file(digest: Any, path: Path) -> None:
    """`path`'s bytes into `digest`, opened without following a link or waiting on a FIFO put
    there since it was listed (then nothing is hashed)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags)
    except OSError:  # replaced by a link since it was listed: its content is not the task's
        return
    with os.fdopen(descriptor, "rb") as file:
        if stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)


def _task_entries(root: Path) -> list[Path]:
    """Every entry under `root`, sorted, without following a link."""
    found = []
    for folder, folders, files in os.walk(root):  # os.walk does not descend into links
        found += [Path(folder) / name for name in [*folders, *files]]
    return sorted(found)
