"""The review app: four tabs over a `ReviewSource`, polled live, decisions behind dialogs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, TabbedContent, TabPane

from reef.review import decisions
from reef.review.model import (
    Access,
    CandidateRow,
    DecisionConflict,
    ReleaseRow,
    ReviewError,
)
from reef.review.screens.candidate_screen import CandidateScreen
from reef.review.screens.candidates_pane import CandidatesPane
from reef.review.screens.dialogs import ConfirmDialog, TextDialog
from reef.review.screens.diff_screen import ReleaseDiffScreen
from reef.review.screens.help import HelpScreen
from reef.review.screens.pane import Pane, Polled
from reef.review.screens.record_screen import RecordScreen
from reef.review.screens.records_pane import RecordsPane
from reef.review.screens.releases_pane import ReleasesPane
from reef.review.screens.scenarios_pane import ScenariosPane
from reef.review.source import ReviewSource

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
        except NoMatches:  # the interval can fire while the app is coming down, its panes gone
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

    def open_candidate(self, candidate_id: str) -> None:
        self.push_screen(CandidateScreen(candidate_id))

    def open_record(self, record_id: str) -> None:
        self.push_screen(RecordScreen(record_id))

    def open_release_diff(self, release_id: str) -> None:
        self.push_screen(ReleaseDiffScreen(release_id))

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
            ("Cycle state filter", "Candidates in one state", candidates.action_cycle_state),
            ("Roll back", "Serve a copy of the selected release", releases.action_rollback),
            ("Promote release", "Copy the selected release to a scenario", releases.action_promote),
        ]

    # -- decisions ----------------------------------------------------------------------------

    def may_decide(self) -> bool:
        if self.access is not None and self.access.can_decide:
            return True
        why = self.access.why if self.access else "still checking what this token may do"
        self.notify(why, title="decisions are disabled", severity="warning")
        return False

    @work(group="decide", exclusive=True)
    async def approve(self, row: CandidateRow) -> None:
        if not self.may_decide() or not decisions.decidable(self, row, "approved"):
            return
        head = (await self._heads()).get(row.scenario)
        dialog = ConfirmDialog(f"Approve {row.id}?", decisions.approve_consequence(row, head))
        if await self.push_screen_wait(dialog):
            await self._decide(
                lambda: self.source.approve(row.id, head),
                lambda release: f"{row.id} is released as {release}: {row.scenario} serves it",
            )

    @work(group="decide", exclusive=True)
    async def reject(self, row: CandidateRow) -> None:
        if not self.may_decide() or not decisions.decidable(self, row, "rejected"):
            return
        head = (await self._heads()).get(row.scenario)
        dialog = TextDialog(f"Reject {row.id}?", decisions.reject_consequence(row, head))
        reason = await self.push_screen_wait(dialog)
        if reason:
            await self._decide(
                lambda: self.source.reject(row.id, reason),
                lambda _: f"{row.id} is rejected: {reason}",
            )

    @work(group="decide", exclusive=True)
    async def rollback(self, row: ReleaseRow) -> None:
        if not self.may_decide():
            return
        head = (await self._heads()).get(row.scenario)
        if head == row.release_id:
            self.notify(f"{row.release_id} is the head of {row.scenario} already")
            return
        consequence = decisions.copy_consequence(row.release_id, row.scenario, head)
        if await self.push_screen_wait(
            ConfirmDialog(f"Roll back to {row.release_id}?", consequence)
        ):
            await self._decide(
                lambda: self.source.rollback(row.scenario, row.release_id, head),
                lambda release: f"{row.scenario} serves {release}, a copy of {row.release_id}",
            )

    @work(group="decide", exclusive=True)
    async def promote(self, row: ReleaseRow) -> None:
        if not self.may_decide():
            return
        prompt = f"Into which scenario should {row.release_id} be promoted?"
        target = await self.push_screen_wait(TextDialog("Promote", prompt, row.scenario))
        if not target:
            return
        head = (await self._heads()).get(target)
        consequence = decisions.copy_consequence(row.release_id, target, head)
        if await self.push_screen_wait(ConfirmDialog(f"Promote {row.release_id}?", consequence)):
            await self._decide(
                lambda: self.source.promote(row.release_id, target, head),
                lambda release: f"{target} serves {release}, a copy of {row.release_id}",
            )

    async def _heads(self) -> dict[str, str | None]:
        try:
            return await asyncio.to_thread(self.source.heads)
        except ReviewError as error:
            self.notify(error.message, severity="error")
            return {}

    async def _decide(self, action: Callable[[], str | None], done: Callable[[Any], str]) -> None:
        """Run a decision; a conflict says what moved, and everything is read again."""
        try:
            result = await asyncio.to_thread(action)
        except DecisionConflict as conflict:
            self.notify(
                f"{conflict.message}. Nothing was changed; the screen is refreshed.",
                title="conflict: it changed since the screen was drawn",
                severity="error",
                timeout=15,
            )
        except ReviewError as error:
            self.notify(error.message, title="not done", severity="error", timeout=15)
        else:
            self.notify(done(result), title="done", timeout=8)
        self.action_refresh()
