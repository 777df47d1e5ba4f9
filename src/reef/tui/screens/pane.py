"""What the app polls: a pane (or a screen) that fetches in a worker thread and shows on the UI."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.widgets import TabbedContent

from reef.review.source import ReviewSource
from reef.tui.widgets.keyed_table import KeyedTable


@runtime_checkable
class Polled(Protocol):
    def fetch(self, source: ReviewSource) -> Any:
        """Read what to show; runs in a worker thread, so it must not touch widgets."""
        ...

    def show(self, data: Any) -> None:
        """Update the widgets in place from what `fetch` read; runs on the UI thread."""
        ...


class Pane(Vertical):
    """One tab of the main screen."""

    def fetch(self, source: ReviewSource) -> Any:
        raise NotImplementedError

    def show(self, data: Any) -> None:
        raise NotImplementedError

    def focus_table(self) -> None:
        self.query(KeyedTable).first().focus()

    def on_show(self) -> None:
        # A pane is shown when its tab becomes active; only then can its table take focus (a
        # hidden widget refuses it). A late Show of a pane whose tab is no longer active must
        # not take focus: TabbedContent would switch back to the tab holding the focus.
        if self._tab_is_active():
            self.focus_table()

    def _tab_is_active(self) -> bool:
        try:
            tabs = self.screen.query_one(TabbedContent)
        except NoMatches:  # the tabs are coming down
            return False
        return self.parent is not None and getattr(self.parent, "id", None) == tabs.active

    def focus_filter(self) -> None:
        """`/`: panes with a filter focus it."""
