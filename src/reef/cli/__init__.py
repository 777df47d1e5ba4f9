"""The `reef` command line. Each command lives in its own module; this file wires them together."""

from __future__ import annotations

import typer

from reef import __version__
from reef.cli import (
    client_commands,
    import_command,
    init_command,
    learning_commands,
    learning_curve_command,
    model_commands,
    release_commands,
    review_command,
    serve_command,
    store_commands,
    tasks_command,
)

app = typer.Typer(
    name="reef",
    help="An OpenAI-compatible inference server that learns from its own traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"reef {__version__}")
        raise typer.Exit()


@app.callback()
def reef(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print Reef's version and exit.",
        is_eager=True,
        callback=_print_version,
    ),
) -> None:
    """An OpenAI-compatible inference server that learns from its own traffic."""


app.command("init")(init_command.init)
app.command("serve")(serve_command.serve)
app.command("status")(client_commands.status)
app.command("records")(client_commands.records)
app.command("report")(client_commands.report)
app.command("export")(client_commands.export)
app.command("import")(import_command.import_records)
app.command("learn")(learning_commands.learn)
app.command("train")(learning_commands.train)
app.command("review")(review_command.review)
app.add_typer(release_commands.app, name="release")
app.add_typer(learning_commands.recipe_app, name="recipe")
app.add_typer(learning_curve_command.app, name="learning")
app.add_typer(store_commands.app, name="store")
app.add_typer(model_commands.app, name="model")
app.add_typer(tasks_command.app, name="tasks")
app.add_typer(tasks_command.agent_app, name="agent")


def main() -> None:
    app()
