"""Shared console output for the CLI: one stdout console, one stderr console, exit helpers."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
