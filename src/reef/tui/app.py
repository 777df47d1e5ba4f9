"""The review app: four tabs over a `ReviewSource`, polled live, decisions behind dialogs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, TabbedContent, TabPane

from reef.review.rows import (
    Access,
    ReviewError,
)
from reef.review.source import ReviewSource
from reef.tui.decisions import DecisionFlow
from reef.tui.messages import (
    Approve,
    OpenCandidate,
    OpenRecord,
    OpenReleaseDiff,
    Promote,
    ReadAgain,
    Reject,
    RollBack,
    StartCanary,
    StartShadow,
)
from reef.tui.screens.candidate_screen import CandidateScreen
from reef.tui.screens.candidates_pane import CandidatesPane
from reef.tui.screens.diff_screen import ReleaseDiffScreen
from reef.tui.screens.help import HelpScreen
from reef.tui.screens.pane import Pane, Polled
from reef.tui.screens.record_screen import RecordScreen
from reef.tui.screens.records_pane import RecordsPane
from reef.tui.screens.releases_pane import ReleasesPane
from reef.tui.screens.scenarios_pane import ScenariosPane

POLL_S = 1.0
TABS = ("candidates", "scenarios", "releases", "records")


class ReviewApp(App[None]):
    CSS_PATH = "review.tcss"
    AUTO_FOCUS = "#candidates-table"
    TITLE = "reef review"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("slash", "filter", "Filter", id="app.filter"),
        Binding("ctrl+r", "refresh", "Refresh", id="app.refresh"),
        *(
            Binding(str(n), f"tab('{tab}')", tab.title(), id=f"app.tab.{tab}", show=False)
            for n, tab in enumerate(TABS, start=1)
        ),
    ]

    def __init__(self, source: ReviewSource, poll_s: float = POLL_S) -> None:
        super().__init__()
        self.source = source
        self.poll_s = poll_s
        self.access: Access | None = None
        self.decisions = DecisionFlow(self, source, lambda: self.access, self.action_refresh)
        self.polls = 0  # completed polls, for whoever waits on one
        self._polling = False
        self._poll_again = False
        self._last_error = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label(id="access-banner")
        with TabbedContent(initial="candidates", id="tabs"):
            with TabPane("1 Candidates", id="candidates"):
                yield CandidatesPane(id="candidates-pane")
            with TabPane("2 Scenarios", id="scenarios"):
                yield ScenariosPane(id="scenarios-pane")
            with TabPane("3 Releases", id="releases"):
                yield ReleasesPane(id="releases-pane")
            with TabPane("4 Records", id="records"):
                yield RecordsPane(id="records-pane")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.source.location
        self.check_access()
        self.set_interval(self.poll_s, self.poll)

    # -- live ---------------------------------------------------------------------------------

    @work(thread=True, group="access")
    def check_access(self) -> None:
        try:
            access = self.source.access()
        except ReviewError as error:
            access = Access(can_decide=False, why=error.message)
        self.call_from_thread(self._show_access, access)

    def _show_access(self, access: Access) -> None:
        self.access = access
        try:
            banner = self.query_one("#access-banner", Label)
        except NoMatches:  # the app is coming down: its widgets are gone
            return
        banner.update("" if access.can_decide else f"read-only: {access.why}")
        banner.set_class(not access.can_decide, "shown")
        self.poll()

    def active_pane(self) -> Pane:
        tab = self.query_one("#tabs", TabbedContent).active or "candidates"
        return self.query_one(f"#{tab}-pane", Pane)

    def poll(self) -> None:
        """Fetch what the visible pane shows, in a worker thread; never two at once."""
        if self._polling:
            self._poll_again = True
            return
        try:
            target: Polled = self.screen if isinstance(self.screen, Polled) else self.active_pane()
        except (NoMatches, ScreenStackError):  # the interval fired while the app is coming down
            return
        self._polling = True
        self.run_worker(lambda: self._fetch(target), thread=True, group="poll")

    def _fetch(self, target: Polled) -> None:
        try:
            data = target.fetch(self.source)
        except ReviewError as error:
            self.call_from_thread(self._poll_failed, error.message)
        else:
            self.call_from_thread(self._poll_done, target, data)

    def _poll_done(self, target: Polled, data: Any) -> None:
        if self._last_error:
            self._last_error = ""
            self.notify("reading again", title="reconnected")
        # Its widgets may have been taken down meanwhile (screen closed, app quitting).
        with contextlib.suppress(NoMatches):
            target.show(data)
        self._poll_finished()

    def _poll_failed(self, message: str) -> None:
        if message != self._last_error:
            self._last_error = message
            self.notify(message, title="cannot read", severity="error", timeout=8)
        self._poll_finished()

    def _poll_finished(self) -> None:
        self._polling = False
        self.polls += 1
        if self._poll_again:
            self._poll_again = False
            self.poll()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.tabbed_content.id == "tabs":
            self.active_pane().focus_table()
            self.poll()

    # -- actions ------------------------------------------------------------------------------

    def action_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_filter(self) -> None:
        self.active_pane().focus_filter()

    def action_refresh(self) -> None:
        if isinstance(self.screen, CandidateScreen):
            self.screen.reload()
        self.poll()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for tab in TABS:
            yield SystemCommand(f"Show {tab}", f"The {tab} tab", lambda t=tab: self.action_tab(t))
        yield SystemCommand("Refresh", "Read the stores again now", self.action_refresh)
        yield SystemCommand("Filter", "Filter or search the visible table", self.action_filter)
        yield SystemCommand("Help", "What the review shows, which keys do what", self.action_help)
        for title, help_text, action in self._pane_commands():
            yield SystemCommand(title, help_text, action)

    def _pane_commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        candidates = self.query_one(CandidatesPane)
        releases = self.query_one(ReleasesPane)
        return [
            ("Approve candidate", "Release the selected candidate", candidates.action_approve),
            ("Reject candidate", "Reject the selected candidate", candidates.action_reject),
            (
                "Canary",
                "Put the selected candidate on a share of sessions",
                candidates.action_canary,
            ),
            (
                "Shadow",
                "Have the selected candidate answer copies of live calls",
                candidates.action_shadow,
            ),
            ("Cycle state filter", "Candidates in one state", candidates.action_cycle_state),
            ("Roll back", "Serve a copy of the selected release", releases.action_rollback),
            ("Promote release", "Copy the selected release to a scenario", releases.action_promote),
        ]

    # -- what the panes and screens ask for ---------------------------------------------------

    def on_open_candidate(self, message: OpenCandidate) -> None:
        self.push_screen(CandidateScreen(message.candidate_id, self.source))

    def on_open_record(self, message: OpenRecord) -> None:
        self.push_screen(RecordScreen(message.record_id, self.source))

    def on_open_release_diff(self, message: OpenReleaseDiff) -> None:
        self.push_screen(ReleaseDiffScreen(message.release_id, self.source))

    def on_read_again(self, message: ReadAgain) -> None:
        self.poll()

    def on_approve(self, message: Approve) -> None:
        self._decide(self.decisions.approve(message.row))

    def on_reject(self, message: Reject) -> None:
        self._decide(self.decisions.reject(message.row))

    def on_start_shadow(self, message: StartShadow) -> None:
        self._decide(self.decisions.shadow(message.row))

    def on_start_canary(self, message: StartCanary) -> None:
        self._decide(self.decisions.canary(message.row))

    def on_roll_back(self, message: RollBack) -> None:
        self._decide(self.decisions.rollback(message.row))

    def on_promote(self, message: Promote) -> None:
        self._decide(self.decisions.promote(message.row))

    def _decide(self, flow: Coroutine[Any, Any, None]) -> None:
        """One decision at a time: its dialogs, then the change, then everything read again."""
        self.run_worker(flow, group="decide", exclusive=True)
