"""Each scenario: what serves, its traffic and feedback, the learning worker, a score curve."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll

from reef.review.rows import ScenarioSummary
from reef.review.source import ReviewSource
from reef.tui.screens.pane import Pane
from reef.tui.widgets import cells
from reef.tui.widgets.keyed_table import Cell, KeyedTable
from reef.tui.widgets.score_curve import ScoreCurve

COLUMNS = (
    "scenario",
    "head",
    "serving",
    "records",
    "reports",
    "recent score",
    "waiting",
    "learning",
)


def scenario_cells(summary: ScenarioSummary) -> list[Cell]:
    return [
        summary.scenario,
        summary.head or "base",
        summary.serving,
        str(summary.records),
        str(summary.reports),
        cells.score(summary.recent_mean),
        str(summary.waiting),
        _last_step(summary.last_step),
    ]


def _last_step(step: dict[str, object] | None) -> str:
    if not step:
        return "-"
    finished = step.get("finished_at")
    at = cells.when(float(finished)) if isinstance(finished, int | float) else ""
    recipe = f"{step['recipe']}: " if step.get("recipe") else ""
    outcome = f"{recipe}{step.get('outcome')} {at}".strip()
    return f"{outcome}: {step['error']}" if step.get("error") else outcome


class ScenariosPane(Pane):
    def compose(self) -> ComposeResult:
        yield KeyedTable(COLUMNS, id="scenarios-table")
        yield VerticalScroll(id="curves")

    def fetch(self, source: ReviewSource) -> list[ScenarioSummary]:
        return source.scenarios()

    def show(self, data: list[ScenarioSummary]) -> None:
        self.query_one(KeyedTable).sync([(s.scenario, scenario_cells(s)) for s in data])
        curves = self.query_one("#curves", VerticalScroll)
        for summary in data:
            found = curves.query(f"#curve-{summary.scenario}")
            if found:
                found.first(ScoreCurve).show(summary)
            else:
                curves.mount(ScoreCurve(summary, id=f"curve-{summary.scenario}", classes="curve"))
