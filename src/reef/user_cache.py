"""The machine's cache folder, shared by every project: copies of models made once (a float32
copy for training, a BF16 or F32 copy that reads prompts). `$REEF_CACHE_DIR`, else
`$XDG_CACHE_HOME/reef`, else `~/.cache/reef`."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    if root := os.environ.get("REEF_CACHE_DIR"):
        return Path(root).expanduser()
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(home) / "reef"
