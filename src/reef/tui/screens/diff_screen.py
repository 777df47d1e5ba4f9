"""A release's diff against its parent."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Header

from reef.review.rows import ReviewError
from reef.review.source import ReviewSource
from reef.tui.widgets.diff_view import DiffView


class ReleaseDiffScreen(Screen[None]):
    AUTO_FOCUS = "DiffView"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back", id="diff.back")
    ]

    def __init__(self, release_id: str, source: ReviewSource) -> None:
        super().__init__()
        self.release_id = release_id
        self.source = source

    def compose(self) -> ComposeResult:
        yield Header()
        yield DiffView(id="release-diff")
        yield Footer()

    @work(thread=True)
    def on_mount(self) -> None:
        source = self.source
        try:
            diff = source.release_diff(self.release_id)
        except ReviewError as error:
            diff = f"cannot read {self.release_id}: {error.message}"
        self.app.call_from_thread(self.query_one(DiffView).show, diff)
