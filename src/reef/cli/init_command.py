"""`reef init`: scaffold a project folder from the templates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reef.cli.output import console, fail
from reef.config import DEFAULT_PORT
from reef.templates import environment

# template name -> file written in the project
SCAFFOLD = {
    "init/reef.yaml.j2": "reef.yaml",
    "init/gitignore.j2": ".gitignore",
    "init/evals/default.jsonl.j2": "evals/default.jsonl",
}


def init(
    directory: Annotated[Path, typer.Argument(help="Project folder (created if missing).")] = Path(
        "."
    ),
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite files that already exist.")
    ] = False,
) -> None:
    """Create reef.yaml, a .gitignore for .reef/ and the gate's eval tasks (evals/default.jsonl)."""
    targets = {template: directory / name for template, name in SCAFFOLD.items()}
    existing = [path for path in targets.values() if path.exists()]
    if existing and not force:
        names = ", ".join(str(path) for path in existing)
        fail(f"{names} already exist(s); nothing was written. Use --force to overwrite.")
    env = environment()
    for template, path in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env.get_template(template).render(port=DEFAULT_PORT))
        console.print(f"[green]wrote[/] {path}")
    console.print(f"Next: [bold]cd {directory} && reef serve[/]")
