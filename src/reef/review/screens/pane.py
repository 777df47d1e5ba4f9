"""What the app polls: a pane (or a screen) that fetches in a worker thread and shows on the UI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from textual.containers import Vertical

from reef.review.source import ReviewSource

if TYPE_CHECKING:
    from reef.review.app import ReviewApp


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

    @property
    def review(self) -> ReviewApp:
        from reef.review.app import ReviewApp

        assert isinstance(self.app, ReviewApp)
        return self.app

    def fetch(self, source: ReviewSource) -> Any:
        raise NotImplementedError

    def show(self, data: Any) -> None:
        raise NotImplementedError

    def focus_table(self) -> None:
        from reef.review.widgets.keyed_table import KeyedTable

        self.query(KeyedTable).first().focus()

    def on_show(self) -> None:
        # A pane is shown when its tab becomes active; only then can its table take focus (a
        # hidden widget refuses it). A late Show of a pane whose tab is no longer active must
        # not take focus: TabbedContent would switch back to the tab holding the focus.
        if self.review.active_pane() is self:
            self.focus_table()

    def focus_filter(self) -> None:
        """`/`: panes with a filter focus it."""
