"""The release chains, newest first: what serves, where each came from; roll back, promote."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Label

from reef.review.rows import ReleaseRow
from reef.review.source import ReviewSource
from reef.tui.messages import OpenReleaseDiff, Promote, RollBack
from reef.tui.screens.pane import Pane
from reef.tui.widgets import cells
from reef.tui.widgets.keyed_table import Cell, KeyedTable

COLUMNS = (
    "release", "serving", "kind", "parent", "created", "cand.", "candidate", "health", "reason"
)


def release_cells(row: ReleaseRow) -> list[Cell]:
    return [
        row.release_id,
        Text("● serving", style="bold green") if row.serving else Text(""),
        " + ".join(row.parts) if row.kind == "agent" and row.parts else row.kind,
        row.parent_release_id or "-",
        cells.when(row.created_at),
        cells.score(row.candidate_mean),
        row.candidate_id or "-",
        cells.short(row.health, 60),
        cells.short(row.reason, 80),
    ]


class ReleasesPane(Pane):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "rollback", "Roll back to", id="releases.rollback"),
        Binding("p", "promote", "Promote", id="releases.promote"),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.rows: dict[str, ReleaseRow] = {}

    def compose(self) -> ComposeResult:
        yield Label("Releases · enter: diff against its parent", classes="pane-title")
        yield KeyedTable(COLUMNS, id="releases-table")

    def fetch(self, source: ReviewSource) -> list[ReleaseRow]:
        return source.releases()

    def show(self, data: list[ReleaseRow]) -> None:
        self.rows = {row.release_id: row for row in data}
        self.query_one(KeyedTable).sync([(row.release_id, release_cells(row)) for row in data])

    def selected(self) -> ReleaseRow | None:
        key = self.query_one(KeyedTable).selected_key
        return self.rows.get(key) if key else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(OpenReleaseDiff(row.release_id))

    def action_rollback(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(RollBack(row))

    def action_promote(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(Promote(row))
