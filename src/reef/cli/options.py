"""What the project commands share: the `-c/--config` option, and loading the config it names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reef.cli.output import fail
from reef.config import ConfigError, ReefConfig, load_config

ConfigOption = Annotated[Path | None, typer.Option("-c", "--config", help="Config file.")]


def project_config(path: Path | None) -> ReefConfig:
    """The config in `path` (or ./reef.yaml), or exit 2 with what is wrong with it."""
    try:
        return load_config(path)
    except ConfigError as error:
        fail(str(error), code=2)
