"""The release chain: one append-only git history per scenario, its head moved by compare-and-swap.

Releases live in a bare repository (`.reef/releases.git`). A release is one commit holding the
artifact's files and a manifest, `reef-release.json`. Each scenario's head is the ref
`refs/reef/<scenario>/head`; it only moves with `git update-ref REF NEW OLD`, so a publisher that
started from a stale head gets a `ReleaseConflict` naming the current one and changes nothing.
Rollback and promote never rewrite history: they publish a new commit whose content equals the
target release.

Weight files (`*.gguf`, `*.safetensors`, `*.bin`, `*.pt`) are stored through Git LFS: the git
objects hold LFS pointers, the bytes live in the repository's LFS store and come back on read.

With a remote (`releases.remote`, `reef.releases.remote`), the repository is this process's copy
of the chain that replicas share: a publish fetches first and lands only once the remote has
taken it, by the same compare-and-swap rule.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import git
from git.index.typ import BaseIndexEntry
from git.objects import Commit

from reef.artifacts import KIND_PARTS, ROUTING, parts_of
from reef.errors import Conflict, NotFound, ReefError
from reef.releases.remote import PushRefused, ReleaseRemote, RemoteUnreachable
from reef.scenario import SCENARIO_NAME, check_scenario

ArtifactKind = Literal["harness", "lora", "agent", "checkpoint"]
ARTIFACT_KINDS: tuple[str, ...] = tuple(KIND_PARTS)
MANIFEST = "reef-release.json"
# `expected_head` of rollback and promote when the caller does not say which head it saw.
CURRENT_HEAD = "<current head>"
BASE_RELEASE = "base"  # what serves before any release: the model alone (reef.inference.binding)
ATTRIBUTES = ".gitattributes"
LFS_PATTERNS = ("*.gguf", "*.safetensors", "*.bin", "*.pt")
_AUTHOR = git.Actor("reef", "reef@localhost")
_NO_COMMIT = "0" * 40
T = TypeVar("T")


class ReleaseConflict(Conflict):
    """The head moved since the publisher read it."""

    code = "release_conflict"

    def __init__(
        self, scenario: str, expected: str | None, current: str | None, what_to_do: str = ""
    ) -> None:
        self.current = current
        super().__init__(
            f"the head of scenario {scenario!r} is {current or 'empty (no release yet)'}, "
            f"not {expected or 'empty'}: "
            + (what_to_do or "someone published first. Re-read the head and try again")
        )


class UnknownRelease(NotFound):
    code = "unknown_release"


class GitLFSMissing(ReefError):
    status = 500
    code = "git_lfs_missing"


@dataclass
class Release:
    """A release's manifest, as stored in `reef-release.json`, plus the commit that holds it."""

    release_id: str
    scenario: str
    kind: str
    parent_release_id: str | None
    created_at: float
    content_hash: str
    candidate_id: str | None = None
    evaluation: dict[str, Any] | None = None
    records_consumed: int = 0
    reason: str | None = None
    origin: dict[str, Any] | None = None  # for rollback and promote: what it copies
    diff: str | None = None  # unified diff of text files against the parent release
    # What it carries: "harness", "adapter" or both (reef.artifacts); empty in manifests written
    # before releases said so, when the kind tells.
    parts: list[str] = field(default_factory=list)
    commit: str = field(default="", compare=False)

    @property
    def number(self) -> int:
        return int(self.release_id.rsplit("@", 1)[1])

    @property
    def carried_parts(self) -> list[str]:
        # A manifest from before releases listed their parts carries no routing policy.
        return self.parts or [p for p in KIND_PARTS.get(self.kind, ()) if p != ROUTING]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def manifest_bytes(self) -> bytes:
        data = {k: v for k, v in asdict(self).items() if k != "commit"}
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def text_diff(
    old: dict[str, bytes], new: dict[str, bytes], old_name: str, new_name: str, limit: int = 20_000
) -> str:
    """A unified diff of the text files that changed. Weight files are only named: `old` holds
    them as git stores them (LFS pointers), so they are compared by content hash, never read."""
    parts = []
    for path in sorted(set(old) | set(new)):
        before, after = old.get(path, b""), new.get(path, b"")
        if is_weight_file(path):
            now = hashlib.sha256(after).hexdigest() if path in new else None
            if _lfs_oid(before) != now:
                state = f"{len(after)} bytes" if path in new else "removed"
                parts.append(f"weights {path} changed: {state}\n")
            continue
        if before == after:
            continue
        parts.append(
            "".join(
                difflib.unified_diff(
                    before.decode(errors="replace").splitlines(True),
                    after.decode(errors="replace").splitlines(True),
                    f"{old_name}/{path}",
                    f"{new_name}/{path}",
                )
            )
        )
    text = "".join(parts)
    return text if len(text) <= limit else text[:limit] + "\n… (diff cut)\n"


def lfs_size(pointer: bytes | None) -> int:
    """The size an LFS pointer records (0 for no file)."""
    found = re.search(rb"^size (\d+)$", pointer or b"", re.MULTILINE)
    return int(found.group(1)) if found else len(pointer or b"")


def _lfs_oid(pointer: bytes) -> str | None:
    found = re.search(rb"^oid sha256:([0-9a-f]{64})$", pointer, re.MULTILINE)
    return found.group(1).decode() if found else None


def scenario_of(release_id: str) -> str:
    scenario, sep, number = release_id.rpartition("@")
    if not sep or not SCENARIO_NAME.fullmatch(scenario) or not number.isdigit():
        raise UnknownRelease(f"{release_id!r} is not a release id: they look like default@3")
    return scenario


def content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


def read_folder(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, keyed by its POSIX path relative to it. A symbolic link inside
    is refused: it could publish a file from outside the folder."""
    if not folder.is_dir():
        raise NotFound(f"artifact folder {folder} does not exist")
    files = {}
    for parent, folders, names in os.walk(folder):
        folders[:] = sorted(name for name in folders if name != ".git")
        for name in [*folders, *sorted(names)]:
            path = Path(parent, name)
            relative = path.relative_to(folder).as_posix()
            if path.is_symlink():
                raise ReefError(
                    f"{relative} is a symbolic link (in {folder}): an artifact holds plain files "
                    "only, so copy the file it points to into the folder instead",
                    status=400,
                )
            if path.is_file():
                files[relative] = path.read_bytes()
    if not files:
        raise ReefError(f"artifact folder {folder} is empty", status=400)
    return dict(sorted(files.items()))


def check_path(path: str) -> None:
    """Refuse an artifact path that could land outside its folder or replace Reef's own files."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or path in (MANIFEST, ATTRIBUTES) or not path:
        raise ReefError(
            f"artifact path {path!r} is not allowed: paths are relative, stay inside the folder "
            f"(no '..') and are not {MANIFEST} or {ATTRIBUTES}",
            status=400,
        )


def is_weight_file(path: str) -> bool:
    return any(fnmatch.fnmatch(PurePosixPath(path).name, pattern) for pattern in LFS_PATTERNS)


def _locked(method: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(method)
    def run(self: ReleaseChain, *args: Any, **kwargs: Any) -> T:
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class ReleaseChain:
    """Read and publish releases in a bare git repository.

    Safe to share between threads (GitPython's repository object is not, so calls take a lock)
    and between processes (the head only moves by compare-and-swap).
    """

    def __init__(
        self,
        path: Path,
        remote: str | None = None,
        on_published: Callable[[Release], None] | None = None,
    ) -> None:
        """The chain in the bare repository at `path`, a copy of `remote`'s when given.
        `on_published(release)` runs after each publish (to tell other replicas)."""
        self._lock = threading.RLock()
        self.path = Path(path)
        if not (self.path / "HEAD").exists():
            self._create()
        try:
            self.repo = git.Repo(self.path)
        except git.GitError as error:
            raise ReefError(f"cannot open the release chain {self.path}: {error}") from None
        self.remote = ReleaseRemote(self.path, remote) if remote else None
        self.on_published = on_published

    def _create(self) -> None:
        """Create the bare repository beside its place and rename it in whole, so that another
        process sees no repository or a complete one. A concurrent creator winning is fine."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}-"))
        except OSError as error:
            raise ReefError(f"cannot create the release chain {self.path}: {error}") from None
        try:
            git.Repo.init(staging, bare=True)
            staging.rename(self.path)  # replaces an empty folder; fails over a non-empty one
        except git.GitError as error:
            raise ReefError(f"cannot create the release chain {self.path}: {error}") from None
        except OSError:
            if not (self.path / "HEAD").exists():
                raise ReefError(
                    f"{self.path} exists but is not a git repository: move it away, and Reef "
                    "creates a new release chain there"
                ) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # -- heads --------------------------------------------------------------------------------

    @staticmethod
    def head_ref(scenario: str) -> str:
        return f"refs/reef/{scenario}/head"

    @staticmethod
    def release_ref(release_id: str) -> str:
        """A ref per release, written when it is published, to find it without a walk."""
        scenario, _, number = release_id.rpartition("@")
        return f"refs/reef/{scenario}/releases/{number}"

    def _read_ref(self, ref: str) -> str | None:
        """The sha a ref points to, read as git resolves it (loose over packed), or None."""
        try:
            sha = (self.path / ref).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            sha = ""
        if len(sha) == 40:
            return sha
        packed = self.path / "packed-refs"
        if packed.exists():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split(" ", 1)[0]
        return None

    def head_commits(self) -> dict[str, str]:
        """Each scenario's head commit sha, read from the ref files as git resolves them (loose
        refs over `packed-refs`), without spawning git: the server polls this several times a
        second. `git update-ref` replaces a ref file atomically, so a read sees old or new."""
        heads: dict[str, str] = {}
        packed = self.path / "packed-refs"
        if packed.exists():
            for line in packed.read_text().splitlines():
                sha, _, ref = line.partition(" ")
                parts = ref.split("/")
                if len(parts) == 4 and parts[:2] == ["refs", "reef"] and parts[3] == "head":
                    heads[parts[2]] = sha
        for loose in (self.path / "refs" / "reef").glob("*/head"):
            try:
                sha = loose.read_text().strip()
            except FileNotFoundError:  # packed away between the listing and the read
                continue
            if len(sha) == 40:
                heads[loose.parent.name] = sha
        return heads

    def catch_up(self) -> bool:
        """Bring this copy up to date with the remote, if any head there differs from here (or
        a fetch left LFS objects behind); whether it fetched. Raises `RemoteUnreachable` (this
        copy is left as it was). Git runs outside the chain's lock: reads go on meanwhile."""
        return self.remote is not None and self.remote.catch_up(self.head_commits())

    def scenarios(self) -> list[str]:
        return sorted(self.head_commits())

    @_locked
    def head(self, scenario: str) -> Release | None:
        sha = self.head_commits().get(scenario)
        return None if sha is None else self._release_at(sha)

    # -- reading ------------------------------------------------------------------------------

    def _release_at(self, sha: str) -> Release:
        commit = self.repo.commit(sha)
        manifest = json.loads(commit.tree[MANIFEST].data_stream.read())
        return Release(**manifest, commit=commit.hexsha)

    @_locked
    def releases(self, scenario: str) -> list[Release]:
        """The scenario's chain, newest first."""
        sha = self.head_commits().get(scenario)
        if sha is None:
            return []
        return [self._release_at(c.hexsha) for c in self.repo.iter_commits(sha, first_parent=True)]

    @_locked
    def get(self, release_id: str) -> Release:
        scenario = scenario_of(release_id)
        sha = self._read_ref(self.release_ref(release_id))
        release = self._release_at(sha) if sha else self._walk_to(release_id)
        if release is None or release.release_id != release_id:
            raise UnknownRelease(
                f"no release {release_id!r}: `reef release list --scenario {scenario}` lists them"
            )
        return release

    def evaluation_of(self, release_id: str) -> dict[str, Any] | None:
        """The gate's evaluation of a release, or None: `base`, a release released without
        one, or one this chain does not hold (calls imported from another chain)."""
        if release_id == "base":
            return None
        try:
            return self.get(release_id).evaluation
        except (ReefError, ValueError):  # unknown, or not a release id at all
            return None

    def _walk_to(self, release_id: str) -> Release | None:
        """Find a release by walking back from its scenario's head (for chains written before
        releases had their own refs), stopping at it: numbers only go down along the chain."""
        wanted = int(release_id.rsplit("@", 1)[1])
        sha = self.head_commits().get(scenario_of(release_id))
        commit = self.repo.commit(sha) if sha else None
        while commit is not None:
            release = self._release_at(commit.hexsha)
            if release.number <= wanted:
                return release if release.number == wanted else None
            commit = commit.parents[0] if commit.parents else None
        return None

    @_locked
    def files(self, release_id: str) -> dict[str, bytes]:
        """The artifact's files, weight files read back from LFS."""
        stored = self.stored_files(release_id)
        return {
            path: self._lfs_smudge(path, data) if is_weight_file(path) else data
            for path, data in stored.items()
        }

    @_locked
    def stored_files(self, release_id: str) -> dict[str, bytes]:
        """The artifact's files as git holds them: LFS pointers for weight files (cheap)."""
        commit = self.repo.commit(self.get(release_id).commit)
        return {
            str(item.path): bytes(item.data_stream.read())
            for item in commit.tree.traverse()
            if isinstance(item, git.Blob) and item.path not in (MANIFEST, ATTRIBUTES)
        }

    @_locked
    def checkout(self, release_id: str, destination: Path) -> Path:
        """Write the artifact's files into `destination`. A release never changes, so a folder
        already there (another process checked it out first) is kept as it is."""
        files = self.files(release_id)
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=".checkout-"))
        for path, data in files.items():
            target = staging / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        try:
            staging.rename(destination)  # atomic: readers see no folder or a whole one
        except OSError:
            shutil.rmtree(staging)
            if not destination.is_dir():
                raise
        return destination

    # -- publishing ---------------------------------------------------------------------------

    @_locked
    def publish(
        self,
        scenario: str,
        kind: str,
        files: dict[str, bytes],
        expected_parent: str | None,
        *,
        candidate_id: str | None = None,
        evaluation: dict[str, Any] | None = None,
        records_consumed: int = 0,
        reason: str | None = None,
        origin: dict[str, Any] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> Release:
        """Append a release to `scenario` if its head is still `expected_parent` (a release id,
        or None for a scenario without releases); raise `ReleaseConflict` otherwise. `fence()`
        runs right before the head moves (here, or on the remote after the LFS objects went):
        it raises (`LeaseLost`) to refuse a publisher that is no longer the leader."""
        check_scenario(scenario)
        if kind not in ARTIFACT_KINDS:
            raise ReefError(
                f"kind must be one of {', '.join(ARTIFACT_KINDS)}, not {kind!r}", status=400
            )
        for path in files:
            check_path(path)
        if self.remote is not None:
            self.remote.fetch()  # the head every replica sees, not only this copy's
        parent = self.head(scenario)
        parent_id = parent.release_id if parent else None
        if parent_id != expected_parent:
            raise ReleaseConflict(scenario, expected_parent, parent_id)
        release = Release(
            release_id=f"{scenario}@{(parent.number if parent else 0) + 1}",
            scenario=scenario,
            kind=kind,
            parent_release_id=parent_id,
            created_at=time.time(),
            content_hash=content_hash(files),
            candidate_id=candidate_id,
            evaluation=evaluation,
            records_consumed=records_consumed,
            reason=reason,
            origin=origin,
            parts=parts_of(files),
            diff=text_diff(
                self.stored_files(parent.release_id) if parent else {},
                files,
                parent_id or "empty",
                "new",
            ),
        )
        commit = self._commit(files, release, parent)
        parent_commit = parent.commit if parent else _NO_COMMIT
        if self.remote is not None:
            self._push(release, commit.hexsha, expected_parent, parent_commit, fence)
        elif fence is not None:
            fence()
        try:
            self.repo.git.update_ref(self.head_ref(scenario), commit.hexsha, parent_commit)
        except git.GitCommandError:
            if self.remote is None:
                raise self._conflict(scenario, expected_parent) from None
            # On the remote already: a fetch by another process sharing this copy moved it.
        # After the head moved: the compare-and-swap made this number ours alone. Were this
        # step lost, lookups of this release would walk the chain instead.
        self.repo.git.update_ref(self.release_ref(release.release_id), commit.hexsha)
        release.commit = commit.hexsha
        if self.on_published is not None:
            self.on_published(release)
        return release

    def _conflict(self, scenario: str, expected_parent: str | None) -> ReleaseConflict:
        current = self.head(scenario)
        return ReleaseConflict(scenario, expected_parent, current.release_id if current else None)

    def _push(
        self,
        release: Release,
        commit: str,
        expected_parent: str | None,
        parent_commit: str,
        fence: Callable[[], None] | None,
    ) -> None:
        """Land the release on the remote before anything moves here: the remote's refusal
        (another replica published first; the head is not the parent this one expected) is the
        compare-and-swap."""
        assert self.remote is not None
        head, number = self.head_ref(release.scenario), self.release_ref(release.release_id)
        old = None if parent_commit == _NO_COMMIT else parent_commit
        try:
            self.remote.push(commit, [head, number], {head: old, number: None}, fence)
        except PushRefused:
            with contextlib.suppress(RemoteUnreachable):
                self.remote.fetch()
            raise self._conflict(release.scenario, expected_parent) from None

    @_locked
    def rollback(
        self,
        scenario: str,
        to: str | None = None,
        reason: str | None = None,
        expected_head: str | None = CURRENT_HEAD,
    ) -> Release:
        """Publish a new release equal to `to` (default: the release before the head), every
        part of it; `to` "base" (the default for a first release) publishes an empty release,
        so that the model alone serves again, as before the first. With `expected_head` (the
        head the caller saw), a head that has moved since is a `ReleaseConflict` and nothing is
        published."""
        head = self.head(scenario)
        if head is None:
            raise UnknownRelease(f"scenario {scenario!r} has no releases to roll back")
        if to is None:
            to = head.parent_release_id or BASE_RELEASE
        if to == BASE_RELEASE:
            return self.publish(
                scenario,
                "harness",
                {},
                head.release_id if expected_head == CURRENT_HEAD else expected_head,
                reason=reason or "rollback to base: the model alone serves",
                origin={"action": "rollback", "release_id": BASE_RELEASE},
            )
        if scenario_of(to) != scenario:
            raise ReefError(f"{to} is not a release of {scenario!r}: use promote", status=400)
        return self._copy(to, scenario, head, "rollback", reason, expected_head)

    @_locked
    def promote(
        self,
        release_id: str,
        scenario: str | None = None,
        reason: str | None = None,
        expected_head: str | None = CURRENT_HEAD,
    ) -> Release:
        """Publish a release of `scenario` (default: the release's own) equal to `release_id`,
        every part of it; `expected_head` as for `rollback`."""
        scenario = scenario or scenario_of(release_id)
        return self._copy(
            release_id, scenario, self.head(scenario), "promote", reason, expected_head
        )

    def _copy(
        self,
        source_id: str,
        scenario: str,
        head: Release | None,
        action: str,
        reason: str | None,
        expected_head: str | None,
    ) -> Release:
        """Publish `source_id`'s files on `scenario`, on the head the caller saw (`expected_head`,
        or CURRENT_HEAD for `head`): publish's compare-and-swap refuses any other."""
        source = self.get(source_id)
        current = head.release_id if head else None
        return self.publish(
            scenario,
            source.kind,
            self.files(source_id),
            current if expected_head == CURRENT_HEAD else expected_head,
            candidate_id=source.candidate_id,
            evaluation=source.evaluation,
            reason=reason or f"{action} to {source_id}",
            origin={"action": action, "release_id": source_id},
        )

    def _commit(self, files: dict[str, bytes], release: Release, parent: Release | None) -> Commit:
        stored = dict(files)
        weights = [path for path in files if is_weight_file(path)]
        for path in weights:
            stored[path] = self._lfs_clean(path, files[path])
        stored[ATTRIBUTES] = "".join(
            f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS
        ).encode()
        stored[MANIFEST] = release.manifest_bytes()
        with tempfile.TemporaryDirectory() as scratch:
            index = git.IndexFile(self.repo, str(Path(scratch) / "index"))
            entries = [
                BaseIndexEntry((0o100644, self._store_blob(data), 0, path))
                for path, data in sorted(stored.items())
            ]
            index.add(entries, write=False)
            tree = index.write_tree()
        parents = [self.repo.commit(parent.commit)] if parent else []
        message = f"{release.release_id}: {release.kind}" + (
            f"\n\n{release.reason}" if release.reason else ""
        )
        return Commit.create_from_tree(
            self.repo,
            tree,
            message,
            parent_commits=parents,
            head=False,
            author=_AUTHOR,
            committer=_AUTHOR,
        )

    def _store_blob(self, data: bytes) -> bytes:
        from io import BytesIO

        from gitdb import IStream

        return bytes(self.repo.odb.store(IStream("blob", len(data), BytesIO(data))).binsha)

    # -- Git LFS ------------------------------------------------------------------------------

    def _lfs(self, verb: str, path: str, data: bytes) -> bytes:
        if shutil.which("git-lfs") is None:
            raise GitLFSMissing(
                f"{path} is a weight file and is stored through Git LFS, which is not installed: "
                "install it (`apt-get install git-lfs`, or `brew install git-lfs`) and try again"
            )
        result = subprocess.run(
            ["git", "lfs", verb, path], input=data, cwd=self.path, capture_output=True, check=False
        )
        if result.returncode != 0:
            raise ReefError(f"git lfs {verb} failed for {path}: {result.stderr.decode().strip()}")
        return result.stdout

    def _lfs_clean(self, path: str, data: bytes) -> bytes:
        return self._lfs("clean", path, data)

    def _lfs_smudge(self, path: str, pointer: bytes) -> bytes:
        return self._lfs("smudge", path, pointer)
