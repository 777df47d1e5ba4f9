"""Where every benchmark writes its figures: `bench/out/` (git-ignored), whatever the folder it
is started from."""

from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "out"
