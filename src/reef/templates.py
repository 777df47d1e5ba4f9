"""Reef's jinja2 templates: `templates/` in the source tree, `reef/_templates` in a wheel."""

from __future__ import annotations

from pathlib import Path

import jinja2


def shipped_dir(name: str) -> Path:
    """A folder shipped beside the package: `reef/_<name>` in a wheel, `<name>/` in the source."""
    installed = Path(__file__).parent / f"_{name}"
    if installed.is_dir():
        return installed
    source_tree = Path(__file__).resolve().parents[2] / name
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError(f"Reef's {name} folder is missing: reinstall reef")


def templates_dir() -> Path:
    return shipped_dir("templates")


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
