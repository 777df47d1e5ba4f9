"""Shared console output for the CLI: one stdout console, one stderr console, exit helpers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
# Control characters (ESC and the rest of C0 but tab and newline, DEL, C1): a terminal obeys
# them, so text from outside (a task's category, an agent's error) never prints them.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
errors = Console(stderr=True)


def as_text(value: object) -> str:
    """Text from outside as Rich prints it literally: control characters shown as `?`, markup
    escaped ("[/red]" in a task's Dockerfile is text, not a style)."""
    return escape(CONTROL.sub("?", str(value)))


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `message` as it is (an install hint's `'reef[plot]'`, a task's own text: never
    read as markup) after a red `error:`, and exit with `code`."""
    errors.print(f"[bold red]error:[/] {as_text(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def add_id_column(table: Table, header: str, ids: Iterable[str]) -> None:
    """A column of ids, never cut however narrow the terminal (they are pasted into other
    commands): as wide as the longest, and the other columns give way."""
    width = max((len(i) for i in ids), default=len(header))
    table.add_column(header, no_wrap=True, min_width=max(width, len(header)))
