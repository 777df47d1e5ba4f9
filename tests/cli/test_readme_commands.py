"""The README's command table names every command and every flag the CLI has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup, TyperOption

from reef.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
# Said once under the table instead of on every row.
COMMON = {"release": {"--config", "--json"}, "client": {"--url", "--config"}}
CLIENT_COMMANDS = {"status", "records", "report", "export", "train"}


def commands(group: TyperGroup, prefix: str = "") -> dict[str, Any]:
    """Every leaf command by its path (`release publish`)."""
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, TyperGroup):
            found.update(commands(command, f"{path} "))
        else:
            found[path] = command
    return found


def table_rows() -> list[str]:
    text = README.read_text()
    table = text[text.index("## Commands") : text.index("## Documentation")]
    return [line for line in table.splitlines() if line.startswith("| `reef ")]


def row_for(path: str, rows: list[str]) -> str:
    """The row that shows `reef PATH`, or a row of its group that lists it as `` `NAME ``."""
    *group, name = path.split()
    prefix = " ".join(["reef", *group])
    for row in rows:
        cell = row.split(" | ")[0]
        if f"`{prefix} {name}" in cell or (
            group and cell.startswith(f"| `{prefix} ") and f"`{name}" in cell
        ):
            return cell
    raise AssertionError(f"the README's command table has no row for `reef {path}`")


def options(command: Any) -> dict[str, list[str]]:
    """Each option's long name with all its spellings (`--config`: `-c`, `--config`)."""
    return {
        next(opt for opt in param.opts if opt.startswith("--")): param.opts
        for param in command.params
        if isinstance(param, TyperOption) and "--help" not in param.opts
    }


def shown(spellings: list[str], cell: str) -> bool:
    """`--limit` anywhere in the row, or a short form as `[-c FILE]`."""
    return any(s in cell if s.startswith("--") else f"[{s} " in cell for s in spellings)


def test_every_command_and_flag_is_in_the_readme_table() -> None:
    rows = table_rows()
    cli = typer.main.get_command(app)
    assert isinstance(cli, TyperGroup)
    missing = []
    for path, command in commands(cli).items():
        cell = row_for(path, rows)
        said_below = COMMON["release"] if path.startswith("release ") else set()
        if path in CLIENT_COMMANDS:
            said_below = COMMON["client"]
        for flag, spellings in sorted(options(command).items()):
            if flag not in said_below and not shown(spellings, cell):
                missing.append(f"reef {path} {flag}")
    assert not missing, f"flags missing from the README's command table: {missing}"
