"""One candidate in detail: its evaluation task by task, its diff, weights and loss, its records."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Label,
    Sparkline,
    Static,
    TabbedContent,
    TabPane,
)

from reef.review.rows import CandidateDetail, ReviewError, TaskView
from reef.review.source import ReviewSource
from reef.tui.messages import Approve, OpenRecord, Reject
from reef.tui.widgets import cells
from reef.tui.widgets.diff_view import DiffView
from reef.tui.widgets.keyed_table import Cell, KeyedTable


def heading(detail: CandidateDetail) -> Text:
    row = detail.row
    return Text.assemble(
        (row.id, "bold"),
        "  ",
        cells.state(row.state),
        f"  {row.kind} · {row.scenario} · from {row.source}",
        f" · built on {row.base_release_id or 'base'}",
        "\nscore ",
        cells.score(row.current_mean),
        " → ",
        cells.score(row.candidate_mean),
        " (",
        cells.delta(row.delta),
        ")",
        f"  released as {row.release_id}" if row.release_id else "",
        f"\n{row.decision or row.reason or ''}",
        f"\ncurves: tensorboard --logdir {detail.run_folder}" if detail.run_folder else "",
    )


class TaskBlock(Vertical):
    """One eval task (or a shadowed call): the prompt, then the two answers side by side."""

    def __init__(self, task: TaskView, sides: tuple[str, str] = ("current", "candidate")) -> None:
        super().__init__(classes="task")
        self.result = task
        self.sides = sides

    def compose(self) -> ComposeResult:
        task = self.result
        before, after = task.current_score, task.candidate_score
        change = None if before is None or after is None else after - before
        yield Label(Text.assemble((task.task_id, "bold"), "  ", cells.delta(change)))
        yield Static(Text(task.prompt, style="italic"), classes="prompt")
        with Horizontal(classes="answers"):
            yield Static(_answer(self.sides[0], before, task.current_answer), classes="answer")
            yield Static(_answer(self.sides[1], after, task.candidate_answer), classes="answer")


def _answer(side: str, score: float | None, text: str) -> Text:
    scored = "unscored" if score is None else f"score {score:g}"
    return Text.assemble((f"{side} · {scored}\n", "bold"), text or "(empty answer)")


class CandidateScreen(Screen[None]):
    AUTO_FOCUS = "#candidate-tabs"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back", id="candidate.back"),
        Binding("a", "approve", "Approve", id="candidate.approve"),
        Binding("r", "reject", "Reject", id="candidate.reject"),
        Binding("left_square_bracket", "tab(-1)", "Previous tab", id="candidate.previous_tab"),
        Binding("right_square_bracket", "tab(1)", "Next tab", id="candidate.next_tab"),
    ]

    def __init__(self, candidate_id: str, source: ReviewSource) -> None:
        super().__init__()
        self.candidate_id = candidate_id
        self.source = source
        self.detail: CandidateDetail | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label(f"loading {self.candidate_id}…", id="candidate-heading", classes="summary")
        tabs = ("Evaluation", "Shadow", "Diff", "Weights", "Records")
        with TabbedContent(*tabs, id="candidate-tabs"):
            yield VerticalScroll(id="tasks")
            yield VerticalScroll(id="shadows")
            yield DiffView(id="candidate-diff")
            with Vertical(id="weights"):
                yield KeyedTable(("file", "bytes", "LFS id"), id="weights-table")
                yield Label("training loss per step", id="loss-label")
                yield Sparkline([], id="loss")
            yield KeyedTable(("record",), id="candidate-records")
        yield Footer()

    def on_mount(self) -> None:
        self.reload()

    @work(thread=True, exclusive=True, group="candidate")
    def reload(self) -> None:
        try:
            detail = self.source.candidate(self.candidate_id)
        except ReviewError as error:
            self.app.call_from_thread(self.app.notify, error.message, severity="error")
            return
        self.app.call_from_thread(self.show, detail)

    def show(self, detail: CandidateDetail) -> None:
        self.detail = detail
        self.query_one("#candidate-heading", Label).update(heading(detail))
        tasks = self.query_one("#tasks", VerticalScroll)
        tasks.remove_children()
        tasks.mount_all(
            [TaskBlock(task) for task in detail.tasks]
            or [Label("not evaluated (policy always, or refused before the gate)")]
        )
        shadows = self.query_one("#shadows", VerticalScroll)
        shadows.remove_children()
        shadows.mount_all(
            [TaskBlock(pair, ("live", "shadow")) for pair in detail.shadows]
            or [Label("no shadow answers: `reef release shadow CANDIDATE` sends it live calls")]
        )
        self.query_one(DiffView).show(detail.diff)
        weights: list[tuple[str, list[Cell]]] = [
            (w.path, [w.path, str(w.size), w.lfs_oid or "-"]) for w in detail.weights
        ]
        self.query_one("#weights-table", KeyedTable).sync(weights)
        self.query_one("#loss", Sparkline).data = detail.loss
        loss = (
            f"training loss per step: {detail.loss[0]:.3f} → {detail.loss[-1]:.3f}"
            if detail.loss
            else "no training metrics recorded"
        )
        self.query_one("#loss-label", Label).update(loss)
        self.query_one("#candidate-records", KeyedTable).sync(
            [(r, [Text(r)]) for r in detail.record_ids]
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "candidate-records" and event.row_key.value:
            self.post_message(OpenRecord(str(event.row_key.value)))

    def action_tab(self, step: int) -> None:
        """Show the detail tab `step` places after the one shown (before, when negative),
        wherever the focus is: an arrow moves between tabs only once the tab row has it."""
        tabbed = self.query_one("#candidate-tabs", TabbedContent)
        panes = [pane.id for pane in tabbed.query(TabPane) if pane.id]
        if tabbed.active in panes:
            tabbed.active = panes[(panes.index(tabbed.active) + step) % len(panes)]

    def action_approve(self) -> None:
        if self.detail is not None:
            self.post_message(Approve(self.detail.row))

    def action_reject(self) -> None:
        if self.detail is not None:
            self.post_message(Reject(self.detail.row))
