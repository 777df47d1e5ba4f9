"""Where the float32 copy of the served model is kept: once per machine, wherever it can be."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.sdk.weights import base_cache


def test_the_copy_goes_where_reef_cache_dir_says_before_the_xdg_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("REEF_CACHE_DIR", str(tmp_path / "reef"))
    assert base_cache() == tmp_path / "reef" / "bases"
    monkeypatch.delenv("REEF_CACHE_DIR")
    assert base_cache() == tmp_path / "xdg" / "reef" / "bases"
    assert (tmp_path / "xdg" / "reef" / "bases").is_dir()


def test_a_cache_folder_that_cannot_be_made_leaves_the_copy_to_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("REEF_CACHE_DIR", str(blocker))
    assert base_cache() is None
