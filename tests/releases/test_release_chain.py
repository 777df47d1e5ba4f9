"""The git release chain on a real bare repository, with real Git LFS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reef.errors import ReefError
from reef.releases.chain import (
    GitLFSMissing,
    ReleaseChain,
    ReleaseConflict,
    UnknownRelease,
    read_folder,
)
from tests.conftest import needs_git_lfs

PROMPT_A = {"AGENTS.md": b"You are helpful.\n", "rules/style.md": b"Be brief.\n"}
PROMPT_B = {"AGENTS.md": b"You are very helpful.\n", "rules/style.md": b"Be brief.\n"}


@pytest.fixture
def chain(tmp_path: Path) -> ReleaseChain:
    return ReleaseChain(tmp_path / "releases.git")


def test_first_release_and_its_manifest(chain: ReleaseChain) -> None:
    release = chain.publish("default", "harness", PROMPT_A, None, reason="first")
    assert release.release_id == "default@1"
    assert release.parent_release_id is None
    assert chain.head("default") == release
    assert chain.files("default@1") == PROMPT_A
    git_files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", chain.head_ref("default")],
        cwd=chain.path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(git_files) == {"AGENTS.md", "rules/style.md", "reef-release.json", ".gitattributes"}


def test_ids_increase_and_the_chain_is_linear(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)
    second = chain.publish("default", "harness", PROMPT_B, "default@1")
    assert second.release_id == "default@2" and second.parent_release_id == "default@1"
    assert "-You are helpful." in (second.diff or "")
    assert "+You are very helpful." in (second.diff or "")
    assert "rules/style.md" not in (second.diff or "")  # unchanged files are not in the diff
    assert [r.release_id for r in chain.releases("default")] == ["default@2", "default@1"]
    other = chain.publish("other", "harness", PROMPT_A, None)
    assert other.release_id == "other@1"
    assert chain.scenarios() == ["default", "other"]


def test_heads_are_read_from_loose_and_packed_refs(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)
    chain.publish("other", "harness", PROMPT_A, None)
    loose = chain.head_commits()
    subprocess.run(["git", "pack-refs", "--all"], cwd=chain.path, check=True)
    assert not (chain.path / "refs/reef/default/head").exists()
    assert chain.head_commits() == loose
    chain.publish("default", "harness", PROMPT_B, "default@1")  # loose again, over the packed one
    assert chain.head("default").release_id == "default@2"  # type: ignore[union-attr]


def test_stale_publisher_gets_a_conflict_naming_the_head(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)
    chain.publish("default", "harness", PROMPT_B, "default@1")
    with pytest.raises(ReleaseConflict, match="default@2") as error:
        chain.publish("default", "harness", PROMPT_A, "default@1")
    assert error.value.status == 409 and error.value.current == "default@2"
    assert chain.head("default").release_id == "default@2"  # type: ignore[union-attr]


def test_concurrent_publishers_on_one_parent_exactly_one_wins(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)

    def publish(n: int) -> str:
        files = {"AGENTS.md": f"variant {n}\n".encode()}
        try:
            return chain.publish("default", "harness", files, "default@1").release_id
        except ReleaseConflict:
            return "conflict"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(publish, range(8)))
    assert outcomes.count("default@2") == 1
    assert outcomes.count("conflict") == 7
    assert [r.release_id for r in chain.releases("default")] == ["default@2", "default@1"]


def test_concurrent_publishers_from_separate_processes(tmp_path: Path) -> None:
    """Two processes, one parent: one wins, the other exits with the conflict."""
    chain = ReleaseChain(tmp_path / "releases.git")
    chain.publish("default", "harness", PROMPT_A, None)
    script = (
        "import sys; from pathlib import Path\n"
        "from reef.releases.chain import ReleaseChain, ReleaseConflict\n"
        "c = ReleaseChain(Path(sys.argv[1]))\n"
        "try:\n"
        "    files = {'AGENTS.md': sys.argv[2].encode()}\n"
        "    print(c.publish('default', 'harness', files, 'default@1').release_id)\n"
        "except ReleaseConflict:\n"
        "    print('conflict')\n"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(chain.path), f"p{n}"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for n in range(4)
    ]
    outcomes = sorted(run.communicate()[0].strip() for run in runs)
    assert outcomes == ["conflict", "conflict", "conflict", "default@2"]


def test_rollback_and_promote_append_new_commits(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)
    chain.publish("default", "harness", PROMPT_B, "default@1")
    rolled = chain.rollback("default")
    assert rolled.release_id == "default@3"
    assert chain.files("default@3") == PROMPT_A
    assert rolled.origin == {"action": "rollback", "release_id": "default@1"}
    promoted = chain.promote("default@2")
    assert promoted.release_id == "default@4" and chain.files("default@4") == PROMPT_B
    # Nothing was rewritten: every old release is still readable.
    assert chain.files("default@1") == PROMPT_A and chain.files("default@2") == PROMPT_B
    assert [r.release_id for r in chain.releases("default")] == [
        f"default@{n}" for n in (4, 3, 2, 1)
    ]
    staged = chain.promote("default@2", scenario="staging")
    assert staged.release_id == "staging@1" and chain.files("staging@1") == PROMPT_B


def test_rollback_to_a_named_release(chain: ReleaseChain) -> None:
    for n, files in enumerate([PROMPT_A, PROMPT_B, PROMPT_A | {"x.md": b"x"}]):
        chain.publish("default", "harness", files, f"default@{n}" if n else None)
    assert chain.rollback("default", to="default@2").release_id == "default@4"
    assert chain.files("default@4") == PROMPT_B


def test_weight_files_are_lfs_pointers_in_git_and_come_back_intact(chain: ReleaseChain) -> None:
    needs_git_lfs()
    weights = os.urandom(300_000)
    files = {"adapter.gguf": weights, "adapter.json": b'{"rank": 4}'}
    release = chain.publish("default", "lora", files, None)
    pointer = chain.stored_files(release.release_id)["adapter.gguf"]
    assert pointer.startswith(b"version https://git-lfs.github.com/spec/v1")
    assert len(pointer) < 200
    assert chain.files(release.release_id)["adapter.gguf"] == weights
    checked_out = chain.checkout(release.release_id, chain.path.parent / "out")
    assert (checked_out / "adapter.gguf").read_bytes() == weights
    # The next release's diff names changed weights without reading them back from LFS.
    same = chain.publish("default", "lora", {**files, "adapter.json": b'{"rank": 8}'}, "default@1")
    assert "adapter.json" in (same.diff or "") and "weights" not in (same.diff or "")
    other = chain.publish("default", "lora", {**files, "adapter.gguf": b"new"}, "default@2")
    assert "weights adapter.gguf changed: 3 bytes" in (other.diff or "")


def test_publishing_weights_without_git_lfs_says_how_to_install_it(
    chain: ReleaseChain, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_git_lfs()
    assert shutil.which("git-lfs"), "git-lfs must be installed for the tests (.ci/run installs it)"
    only_git = chain.path.parent / "bin"
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))  # type: ignore[arg-type]
    monkeypatch.setenv("PATH", str(only_git))
    with pytest.raises(GitLFSMissing, match="apt-get install git-lfs"):
        chain.publish("default", "lora", {"a.gguf": b"weights"}, None)
    monkeypatch.undo()
    assert chain.head("default") is None


def test_paths_outside_the_tree_are_refused(chain: ReleaseChain) -> None:
    for bad in ("../escape.md", "/abs.md", "reef-release.json"):
        with pytest.raises(Exception, match="not allowed"):
            chain.publish("default", "harness", {bad: b"x"}, None)


def test_unknown_release_ids(chain: ReleaseChain) -> None:
    with pytest.raises(UnknownRelease, match="default@3"):
        chain.get("default@3")
    with pytest.raises(UnknownRelease, match="not a release id"):
        chain.get("nonsense")


def test_read_folder_keeps_relative_posix_paths(tmp_path: Path) -> None:
    (tmp_path / "skills/search").mkdir(parents=True)
    (tmp_path / "skills/search/SKILL.md").write_text("search")
    (tmp_path / "AGENTS.md").write_text("prompt")
    assert read_folder(tmp_path) == {"AGENTS.md": b"prompt", "skills/search/SKILL.md": b"search"}


def _drop_object(chain: ReleaseChain, sha: str) -> None:
    (chain.path / "objects" / sha[:2] / sha[2:]).unlink()


def test_a_release_is_read_without_reading_the_rest_of_the_chain(chain: ReleaseChain) -> None:
    for n, files in enumerate([PROMPT_A, PROMPT_B, PROMPT_A]):
        chain.publish("default", "harness", files, f"default@{n}" if n else None)
    assert (chain.path / "refs/reef/default/releases/2").is_file()
    # Without the oldest commit, a lookup that walked the chain would fail on it.
    _drop_object(chain, chain.get("default@1").commit)
    assert chain.get("default@2").release_id == "default@2"
    assert chain.files("default@3") == PROMPT_A
    assert chain.publish("default", "harness", PROMPT_B, "default@3").release_id == "default@4"


def test_a_chain_written_before_release_refs_is_still_read(chain: ReleaseChain) -> None:
    for n, files in enumerate([PROMPT_A, PROMPT_B, PROMPT_A]):
        chain.publish("default", "harness", files, f"default@{n}" if n else None)
    shutil.rmtree(chain.path / "refs/reef/default/releases")
    # The walk from the head stops at the match: it never reaches default@1 for default@2.
    _drop_object(chain, chain.get("default@1").commit)
    assert chain.get("default@2").release_id == "default@2"
    assert chain.files("default@3") == PROMPT_A
    with pytest.raises(UnknownRelease, match="default@9"):
        chain.get("default@9")


def test_release_refs_are_read_when_packed(chain: ReleaseChain) -> None:
    chain.publish("default", "harness", PROMPT_A, None)
    chain.publish("default", "harness", PROMPT_B, "default@1")
    subprocess.run(["git", "pack-refs", "--all"], cwd=chain.path, check=True)
    assert not (chain.path / "refs/reef/default/releases/1").exists()
    assert chain.files("default@1") == PROMPT_A
    assert chain.head_commits().keys() == {"default"}


def test_read_folder_refuses_a_symlinked_file(tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "AGENTS.md").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(ReefError, match=r"AGENTS\.md is a symbolic link"):
        read_folder(folder)
