"""Shared console output for the CLI: one stdout console, one stderr console, exit helpers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `message` as it is (an install hint's `'reef[plot]'`, a task's own text: never
    read as markup) after a red `error:`, and exit with `code`."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def add_id_column(table: Table, header: str, ids: Iterable[str]) -> None:
    """A column of ids, never cut however narrow the terminal (they are pasted into other
    commands): as wide as the longest, and the other columns give way."""
    width = max((len(i) for i in ids), default=len(header))
    table.add_column(header, no_wrap=True, min_width=max(width, len(header)))
