"""Scenario names: they appear in headers, file names and git refs, so they are kept plain."""

from __future__ import annotations

import re

from reef.errors import BadRequest

DEFAULT_SCENARIO = "default"
# Matched whole, with `.fullmatch`: `^...$` would let a trailing newline through (`default\n`, into
# a git ref name).
SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_scenario(name: str) -> str:
    if not SCENARIO_NAME.fullmatch(name):
        raise BadRequest(
            f"{name!r} is not a valid scenario name: use letters, digits, '_' and '-', "
            "starting with a letter or digit, at most 64 characters"
        )
    return name
