"""Episode tests run real bubblewrap: skipped where it is missing or cannot run, but failed in
CI when it is missing (.ci/run installs it), where a skipped sandbox test would pass for nothing.
A machine whose kernel refuses bubblewrap's namespaces skips them, saying why, even in CI."""

from __future__ import annotations

import os
import shutil

import pytest

from reef.episodes.sandbox import bwrap_problem


def require_bwrap() -> None:
    if os.environ.get("CI") and shutil.which("bwrap") is None:
        pytest.fail("CI must run the episode tests: .ci/run installs bubblewrap")
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(problem)
