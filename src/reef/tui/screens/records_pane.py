"""Recent traffic with its feedback, searchable in the store."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable, Input

from reef.review.rows import RecordRow
from reef.review.source import ReviewSource
from reef.tui.messages import OpenRecord, ReadAgain
from reef.tui.screens.pane import Pane
from reef.tui.widgets import cells
from reef.tui.widgets.keyed_table import Cell, KeyedTable

COLUMNS = ("record", "time", "scenario", "release", "prompt", "answer", "feedback")


def record_cells(row: RecordRow) -> list[Cell]:
    return [
        row.id,
        cells.when(row.created_at),
        row.scenario,
        row.release_id,
        cells.short(row.prompt, 40),
        cells.short(row.answer, 40),
        cells.short(row.feedback, 40) or "-",
    ]


class RecordsPane(Pane):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.search = ""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="/ search prompts and answers, enter to apply", id="records-search")
        yield KeyedTable(COLUMNS, id="records-table")

    def fetch(self, source: ReviewSource) -> list[RecordRow]:
        return source.records(self.search)

    def show(self, data: list[RecordRow]) -> None:
        self.query_one(KeyedTable).sync([(row.id, record_cells(row)) for row in data])

    def focus_filter(self) -> None:
        self.query_one("#records-search", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.search = event.value.strip()
        self.query_one(KeyedTable).focus()
        self.post_message(ReadAgain())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = self.query_one(KeyedTable).selected_key
        if key:
            self.post_message(OpenRecord(key))
