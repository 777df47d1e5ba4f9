"""How values read in a table cell: states and score deltas coloured, times short."""

from __future__ import annotations

import time
from datetime import datetime

from rich.text import Text

STATE_STYLES = {
    "held": "bold yellow",
    "proposed": "cyan",
    "evaluating": "blue",
    "released": "green",
    "rejected": "red",
}


def state(value: str) -> Text:
    return Text(value, style=STATE_STYLES.get(value, ""))


def score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def delta(value: float | None) -> Text:
    if value is None:
        return Text("-", style="dim")
    style = "green" if value > 0 else "red" if value < 0 else "dim"
    return Text(f"{value:+.2f}", style=style)


def lost(count: int) -> Text:
    """How many tasks a candidate lost: red when any (regressions catch the eye first)."""
    return Text(str(count), style="bold red") if count else Text("0", style="dim")


def when(timestamp: float) -> str:
    """The time of day for today, the date otherwise."""
    moment = datetime.fromtimestamp(timestamp)
    today = datetime.fromtimestamp(time.time()).date()
    return moment.strftime("%H:%M:%S" if moment.date() == today else "%Y-%m-%d")


def short(text: str | None, width: int = 60) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
