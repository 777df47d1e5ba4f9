"""The main tab: one row per candidate, held first, with the gate's scores."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Input, Label

from reef.review.rows import CandidateRow
from reef.review.source import ReviewSource
from reef.store.candidates import STATES
from reef.tui.messages import (
    Approve,
    OpenCandidate,
    ReadAgain,
    Reject,
    StartCanary,
    StartShadow,
)
from reef.tui.screens.pane import Pane
from reef.tui.widgets import cells
from reef.tui.widgets.keyed_table import Cell, KeyedTable

COLUMNS = (
    "candidate",
    "state",
    "kind",
    "scenario",
    "origin",
    "base",
    "cur.",
    "cand.",
    "Δ",
    "lost",
    "why",
)
FILTERS: tuple[str | None, ...] = (None, *STATES)


def candidate_cells(row: CandidateRow) -> list[Cell]:
    return [
        row.id,
        cells.state(row.state),
        row.kind,
        row.scenario,
        row.source,
        row.base_release_id or "base",
        cells.score(row.current_mean),
        cells.score(row.candidate_mean),
        cells.delta(row.delta),
        cells.lost(row.lost),
        cells.short(row.decision or row.reason, 80),
    ]


class CandidatesPane(Pane):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "approve", "Approve", id="candidates.approve"),
        Binding("r", "reject", "Reject", id="candidates.reject"),
        Binding("c", "canary", "Canary", id="candidates.canary"),
        Binding("h", "shadow", "Shadow", id="candidates.shadow"),
        Binding("s", "cycle_state", "State filter", id="candidates.state"),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.state_filter: str | None = None
        self.rows: dict[str, CandidateRow] = {}

    def compose(self) -> ComposeResult:
        yield Label(id="candidates-title", classes="pane-title")
        yield Input(placeholder="filter rows (id, state, kind, reason)", id="candidates-filter")
        yield KeyedTable(COLUMNS, id="candidates-table")
        yield Label(id="candidate-summary", classes="summary")

    def on_mount(self) -> None:
        self._title()

    @property
    def table(self) -> KeyedTable:
        return self.query_one("#candidates-table", KeyedTable)

    def fetch(self, source: ReviewSource) -> list[CandidateRow]:
        return source.candidates(self.state_filter)

    def show(self, data: list[CandidateRow]) -> None:
        self.rows = {row.id: row for row in data}
        text = self.query_one("#candidates-filter", Input).value.strip().lower()
        shown = [row for row in data if not text or text in _searchable(row)]
        self.table.sync([(row.id, candidate_cells(row)) for row in shown])
        self._title(len(shown))
        self._summarize()

    def selected(self) -> CandidateRow | None:
        key = self.table.selected_key
        return self.rows.get(key) if key else None

    def _title(self, count: int | None = None) -> None:
        state = self.state_filter or "all states"
        held = sum(row.state == "held" for row in self.rows.values())
        counted = "" if count is None else f" · {count} shown · {held} held"
        self.query_one("#candidates-title", Label).update(
            Text.assemble(("Candidates", "bold"), f" · {state}{counted} · s: state filter")
        )

    def _summarize(self) -> None:
        row = self.selected()
        summary = self.query_one("#candidate-summary", Label)
        if row is None:
            summary.update("no candidates here yet: `reef release publish DIR --kind harness`")
            return
        summary.update(
            Text.assemble(
                (row.id, "bold"),
                " ",
                cells.state(row.state),
                f" · {row.kind} · {row.scenario}",
                f"\n{row.decision or row.reason or ''}",
                canary_summary(row.canary) if row.canary else "",
            )
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._summarize()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(OpenCandidate(row.id))

    def on_input_changed(self, event: Input.Changed) -> None:
        self.show(list(self.rows.values()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    def focus_filter(self) -> None:
        self.query_one("#candidates-filter", Input).focus()

    def action_cycle_state(self) -> None:
        self.state_filter = FILTERS[(FILTERS.index(self.state_filter) + 1) % len(FILTERS)]
        self._title()
        self.post_message(ReadAgain())

    def action_approve(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(Approve(row))

    def action_reject(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(Reject(row))

    def action_shadow(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(StartShadow(row))

    def action_canary(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(StartCanary(row))


NEXT = {
    "wait": "waits for more reports",
    "promote": "is promoted at the next check",
    "rollback": "is rolled back at the next check",
}


def canary_summary(verdict: dict[str, Any]) -> str:
    """A live canary in three lines: the arms, the estimate and its interval, what is next."""
    arms = " · ".join(
        f"{name} {_mean(verdict[name])} on {verdict[name]['reports']} report(s)"
        for name in ("stable", "canary")
    )
    lines = [f"\ncanary: {arms}"]
    if verdict.get("difference") is not None:
        low, high = verdict["interval"]
        lines.append(
            f"\ndifference {verdict['difference']:+.3f}, interval {low:+.3f} to {high:+.3f}"
        )
    lines.append(f"\nnext: it {NEXT[verdict['action']]}")
    return "".join(lines)


def _mean(arm: dict[str, Any]) -> str:
    return "-" if arm["mean"] is None else f"{arm['mean']:.3f}"


def _searchable(row: CandidateRow) -> str:
    return " ".join(
        str(part) for part in (row.id, row.state, row.kind, row.source, row.reason, row.decision)
    ).lower()
