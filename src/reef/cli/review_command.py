"""`reef review`: the Textual dashboard, on the project's stores or on a server (--url)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from reef.cli.output import fail
from reef.client import env_token
from reef.config import ConfigError, load_config
from reef.errors import ReefError

if TYPE_CHECKING:
    from reef.review.source import ReviewSource


def review(
    config: Annotated[Path | None, typer.Option("-c", "--config", help="Config file.")] = None,
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", envvar="REEF_URL", help="Review a server instead (REEF_ADMIN_TOKEN decides)."
        ),
    ] = None,
) -> None:
    """Review candidates, releases and experience, live; approve, reject, roll back."""
    from reef.tui.app import ReviewApp  # Textual loads only for this command

    source = _http_source(url, scenario) if url else _local_source(config, scenario)
    try:
        ReviewApp(source).run()
    finally:
        source.close()


def _local_source(config_path: Path | None, scenario: str | None) -> ReviewSource:
    from reef.review.local_source import LocalSource

    try:
        config = load_config(config_path)
    except ConfigError as error:
        fail(str(error), code=2)
    try:
        return LocalSource(config, scenario)
    except ReefError as error:
        fail(error.message)


def _http_source(url: str, scenario: str | None) -> ReviewSource:
    from reef.review.http_source import HttpSource

    return HttpSource(url, env_token("REEF_ADMIN_TOKEN") or env_token("REEF_TOKEN"), scenario)
