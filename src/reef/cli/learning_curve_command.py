"""`reef learning curve`: a scenario's live feedback per release, drawn as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import console, fail
from reef.errors import ReefError
from reef.releases.workflow import ReleaseWorkflow
from reef.review import queries
from reef.review.drawing import draw_learning_curve
from reef.store import ExperienceStore

app = typer.Typer(help="Is it learning? The live pass rate per release.", no_args_is_help=True)


@app.command()
def curve(
    scenario: Annotated[str, typer.Option(help="The scenario to draw.")] = "default",
    out: Annotated[Path, typer.Option(help="The PNG to write.")] = Path("learning-curve.png"),
    config: ConfigOption = None,
) -> None:
    """Draw the scenario's feedback over time, each release's live pass rate with its 95%
    interval, and where each release began serving (reads .reef/ directly: no server needed)."""
    resolved = project_config(config)
    try:
        with ExperienceStore(resolved.experience_store, resolved.store.synchronous) as store:
            summaries = queries.scenario_summaries(ReleaseWorkflow(resolved, store))
            summary = next((s for s in summaries if s.scenario == scenario), None)
            if summary is None:
                known = ", ".join(s.scenario for s in summaries) or "none yet"
                fail(f"no records or releases for scenario {scenario!r} (scenarios: {known})")
            drawn = draw_learning_curve(summary, out)
    except ReefError as error:
        fail(error.message, code=2 if error.status == 400 else 1)
    console.print(f"[green]wrote[/] {drawn}", highlight=False)
    for release in summary.releases:
        found = release["reports"]
        if found["count"]:
            console.print(
                f"  {release['release_id']}: {found['passed']}/{found['count']} reports passed "
                f"({found['low']:.0%}-{found['high']:.0%})",
                highlight=False,
            )
        if release.get("below_gate"):
            console.print(
                f"  [bold red]{release['release_id']} serves below its gate:[/] "
                f"{release['below_gate']}",
                highlight=False,
                soft_wrap=True,
            )
