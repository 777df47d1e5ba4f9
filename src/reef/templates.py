"""Reef's jinja2 templates: `templates/` in the source tree, `reef/_templates` in a wheel."""

from __future__ import annotations

from pathlib import Path

import jinja2


def templates_dir() -> Path:
    installed = Path(__file__).parent / "_templates"
    if installed.is_dir():
        return installed
    source_tree = Path(__file__).resolve().parents[2] / "templates"
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError("Reef's templates are missing: reinstall reef")


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
