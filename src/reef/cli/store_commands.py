"""`reef store info|migrate`: where the project's experience lives, and moving it elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import console, fail
from reef.config import ReefConfig
from reef.errors import ReefError
from reef.store import ExperienceStore
from reef.store.database import is_postgres
from reef.store.transfer import copy_store, row_counts

app = typer.Typer(
    help="The experience store: where it is, and moving it (SQLite <-> PostgreSQL).",
    no_args_is_help=True,
)


def _open(location: Path | str, config: ReefConfig) -> ExperienceStore:
    try:
        return ExperienceStore(location, config.store.synchronous)
    except ReefError as error:
        fail(error.message)


@app.command("info")
def info(config: ConfigOption = None) -> None:
    """Where the experience store is, and how many rows each table holds."""
    resolved = project_config(config)
    with _open(resolved.experience_store, resolved) as store:
        table = Table(title=f"{store.dialect}: {store.name}")
        table.add_column("table")
        table.add_column("rows", justify="right")
        for name, rows in row_counts(store).items():
            table.add_row(name, str(rows))
        console.print(table)


@app.command("migrate")
def migrate(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The new store: a postgresql:// URL (its password in PGPASSWORD or ~/.pgpass) "
            "or a SQLite file's path. It must hold no experience yet.",
        ),
    ],
    config: ConfigOption = None,
) -> None:
    """Copy all experience (records, reports, candidates, learning state) into another store.

    Stop `reef serve` first: what it stores during the copy would not be copied. Then set
    `store.url` to the new store in reef.yaml (or REEF_STORE_URL)."""
    resolved = project_config(config)
    target_location: Path | str = to if is_postgres(to) else Path(to).expanduser()
    with _open(resolved.experience_store, resolved) as source:
        totals = row_counts(source)
        with _open(target_location, resolved) as target:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
            with Progress(*columns, console=console, transient=True) as bars:
                tasks = {name: bars.add_task(name, total=n) for name, n in totals.items()}
                try:
                    copied = copy_store(
                        source, target, lambda name, n: bars.advance(tasks[name], n)
                    )
                except ReefError as error:
                    fail(error.message)
            console.print(
                f"Copied {sum(copied.values())} rows from {source.name} to {target.name}: "
                + ", ".join(f"{n} {name}" for name, n in copied.items() if n),
                highlight=False,
                soft_wrap=True,
            )
    console.print(
        "Next: set store.url in reef.yaml (or REEF_STORE_URL) to the store you migrated to, "
        "its password in PGPASSWORD or ~/.pgpass."
    )
