"""Reef's built-in learning recipes, one subpackage each (the `reef.recipes` entry points).

Their source lives in the repository's top-level `recipes/` folder (one folder per recipe, as
the design card draws it). The wheel installs that folder here, under Reef's own name, so no
top-level `recipes` package clashes with another; in a source checkout (an editable install)
this package reads the folder where it is. Each recipe is registered as an entry point of the
`reef.recipes` group in pyproject.toml, as a third-party recipe is (see reef.sdk.recipe).
"""

from pathlib import Path

_SOURCE_FOLDER = Path(__file__).resolve().parents[3] / "recipes"
if _SOURCE_FOLDER.is_dir():
    __path__.append(str(_SOURCE_FOLDER))
