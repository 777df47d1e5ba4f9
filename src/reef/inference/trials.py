"""Harness trees a recipe is trying, not released: each written once under the state folder,
named by its content, and read as a release's harness is.

The learning worker writes them (`generate_under`, and the episodes a search runs under a tree);
the server reads one when an episode's grant names its tree `trial:<digest>`, so an agent in
the sandbox is served by the tree being tried, with the weights that serve now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import threading
from pathlib import Path

from reef.inference.binding import Binding, binding_for

TRIALS = Path("learning") / "trials"
DIGEST = re.compile(r"[0-9a-f]{16}")


class UnknownTrial(ValueError):
    """A trial tree that was never written under this state folder (or a malformed name)."""


def trial_digest(files: dict[str, bytes]) -> str:
    """The name of a tree: the first 16 hex digits of the SHA-256 of its files."""
    return hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]


def trials_folder(state_dir: Path) -> Path:
    return state_dir / TRIALS


def write_trial(state_dir: Path, files: dict[str, bytes]) -> str:
    """Write `files` under the state folder once (a staged folder renamed into place, so a
    reader never sees half a tree), and answer its digest."""
    digest = trial_digest(files)
    folder = trials_folder(state_dir) / digest
    if not folder.is_dir():
        staging = folder.with_name(f".{digest}.{os.getpid()}.{threading.get_ident()}")
        shutil.rmtree(staging, ignore_errors=True)
        for path, data in files.items():
            (staging / path).parent.mkdir(parents=True, exist_ok=True)
            (staging / path).write_bytes(data)
        staging.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another thread wrote the same tree first
            staging.rename(folder)
        shutil.rmtree(staging, ignore_errors=True)
    return digest


def trial_binding(state_dir: Path, digest: str, serving: Binding) -> Binding:
    """The binding of trial tree `digest`: its harness, with the weights `serving` serves."""
    if not DIGEST.fullmatch(digest):
        raise UnknownTrial(f"{digest!r} is not a trial tree's name (16 hex digits)")
    folder = trials_folder(state_dir) / digest
    if not folder.is_dir():
        raise UnknownTrial(f"trial tree {digest} was not written under {state_dir}")
    tried = binding_for(f"trial-{digest}", "harness", folder, strict=True)
    return dataclasses.replace(tried, adapter=serving.adapter, checkpoint=serving.checkpoint)
