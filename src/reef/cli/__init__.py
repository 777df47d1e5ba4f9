"""The `reef` command line. Each command lives in its own module; this file wires them together."""

from __future__ import annotations

import typer

from reef.cli import client_commands, init_command, release_commands, serve_command

app = typer.Typer(
    name="reef",
    help="An OpenAI-compatible inference server that learns from its own traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("init")(init_command.init)
app.command("serve")(serve_command.serve)
app.command("status")(client_commands.status)
app.command("records")(client_commands.records)
app.command("report")(client_commands.report)
app.command("export")(client_commands.export)
app.add_typer(release_commands.app, name="release")


def main() -> None:
    app()
