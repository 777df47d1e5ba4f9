"""The release chain shared through a git remote (a `file://` bare repository, with the real
git and git-lfs): publishing lands on the remote before anything moves locally, a stale publish
is the usual conflict, followers only ever move forward, and a chain made before the remote was
set is never wiped by it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reef.releases.chain import ReleaseChain, ReleaseConflict
from reef.releases.remote import RemoteUnreachable

HARNESS = {"AGENTS.md": b"Be brief.\n"}


@pytest.fixture
def remote_url(tmp_path: Path) -> str:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(bare)], check=True)
    return f"file://{bare}"


def replica(tmp_path: Path, name: str, remote_url: str | None) -> ReleaseChain:
    return ReleaseChain(tmp_path / name / "releases.git", remote_url)


def test_a_release_published_on_one_copy_reaches_another_with_its_weights(
    tmp_path: Path, remote_url: str
) -> None:
    first, second = replica(tmp_path, "a", remote_url), replica(tmp_path, "b", remote_url)
    weights = {"adapter.gguf": b"GGUF" + bytes(range(256)) * 64}
    published = first.publish("default", "lora", weights, None)
    assert second.head("default") is None
    assert second.catch_up() and not second.catch_up()  # fetched once; then nothing new
    assert second.head("default").release_id == published.release_id  # type: ignore[union-attr]
    assert second.files("default@1") == weights  # the LFS object came with it
    later = second.publish("default", "harness", HARNESS, "default@1")
    assert first.catch_up() and first.head("default").release_id == later.release_id  # type: ignore[union-attr]


def test_a_stale_publish_is_a_conflict_and_moves_nothing_here(
    tmp_path: Path, remote_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = replica(tmp_path, "a", remote_url), replica(tmp_path, "b", remote_url)
    first.publish("default", "harness", HARNESS, None)
    # The second copy looked before the first published (its fetch found nothing yet).
    monkeypatch.setattr(second.remote, "fetch", lambda: None)
    with pytest.raises(ReleaseConflict):
        second.publish("default", "harness", {"AGENTS.md": b"Be kind.\n"}, None)
    assert second.head("default") is None  # the refused release never served here
    monkeypatch.undo()
    second.catch_up()
    assert second.head("default").release_id == "default@1"  # type: ignore[union-attr]
    assert second.files("default@1") == HARNESS  # the first copy's, not the refused one


def test_a_chain_made_before_the_remote_is_never_wiped_by_it(
    tmp_path: Path, remote_url: str
) -> None:
    local = replica(tmp_path, "laptop", None)
    local.publish("default", "harness", HARNESS, None)
    elsewhere = replica(tmp_path, "other", remote_url)
    elsewhere.publish("default", "harness", {"AGENTS.md": b"Another chain.\n"}, None)
    elsewhere.publish("support", "harness", HARNESS, None)
    shared = ReleaseChain(local.path, remote_url)  # the laptop's copy, the remote now set
    shared.catch_up()
    assert shared.files("default@1") == HARNESS  # its own chain stays: no descendant of it
    assert shared.remote.state.diverged == ["default"]  # type: ignore[union-attr]
    assert not shared.catch_up()  # nothing moved on the remote: no fetch at every look
    assert shared.head("support").release_id == "support@1"  # type: ignore[union-attr]
    with pytest.raises(ReleaseConflict):  # and it cannot push over the remote's
        shared.publish("default", "harness", {"AGENTS.md": b"Mine.\n"}, "default@1")


def test_an_unreachable_remote_leaves_the_copy_serving_what_it_has(
    tmp_path: Path, remote_url: str
) -> None:
    chain = replica(tmp_path, "a", remote_url)
    chain.publish("default", "harness", HARNESS, None)
    gone = ReleaseChain(chain.path, "file:///nowhere/remote.git")
    with pytest.raises(RemoteUnreachable, match="could not be reached"):
        gone.catch_up()
    assert gone.head("default").release_id == "default@1"  # type: ignore[union-attr]
    assert gone.remote.state.reachable is False  # type: ignore[union-attr]


def test_a_token_in_the_remote_url_stays_out_of_messages_and_git_command_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "https://reef:s3cret-token@127.0.0.1:9/releases.git"
    chain = replica(tmp_path, "a", url)
    command_lines: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(args: list[str], **kwargs: object) -> subprocess.Popen[str]:
        command_lines.append(list(args))
        return real_popen(args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr("reef.releases.remote.subprocess.Popen", popen)
    with pytest.raises(RemoteUnreachable) as refused:
        chain.catch_up()
    assert command_lines and all("s3cret-token" not in " ".join(c) for c in command_lines)
    assert "s3cret-token" not in refused.value.message
    assert "s3cret-token" not in str(chain.remote.state.to_json())  # type: ignore[union-attr]
