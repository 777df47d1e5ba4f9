"""A unified diff, coloured line by line, in a scrolling view."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

_LINE_STYLES = (
    ("+++", "bold"),
    ("---", "bold"),
    ("@@", "cyan"),
    ("+", "green"),
    ("-", "red"),
    ("weights ", "magenta"),
)


def coloured_diff(diff: str) -> Text:
    text = Text()
    for line in diff.splitlines(keepends=True):
        style = next((s for prefix, s in _LINE_STYLES if line.startswith(prefix)), "")
        text.append(line, style=style)
    return text


class DiffView(VerticalScroll):
    """Holds one diff; `show` replaces it."""

    def compose(self) -> ComposeResult:
        yield Static(id="diff-text")

    def show(self, diff: str) -> None:
        self.query_one("#diff-text", Static).update(coloured_diff(diff))
