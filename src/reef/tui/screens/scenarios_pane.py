"""Each scenario: what serves, its traffic and feedback, the learning worker, a score curve, and
each release's live pass rate (is it learning?)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from reef.evaluation.live import beside_base, said
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
    "serving passes",
    "waiting",
    "learning",
)
RELEASE_COLUMNS = (
    "scenario",
    "release",
    "served",
    "reports passed",
    "scorer accepts",
    "vs the base on its calls",
    "gate said (feedback)",
    "against its gate",
)


def scenario_cells(summary: ScenarioSummary) -> list[Cell]:
    return [
        summary.scenario,
        summary.head or "base",
        summary.serving,
        str(summary.records),
        str(summary.reports),
        said(summary.pass_rate_of(summary.serving)),
        str(summary.waiting),
        _last_step(summary.last_step),
    ]


def release_rows(summary: ScenarioSummary) -> list[tuple[str, list[Cell]]]:
    """One row per release that served the scenario's calls, base first."""
    return [
        (
            f"{summary.scenario}/{release['release_id']}",
            [
                summary.scenario,
                release["release_id"],
                str(release["served"]),
                said(release["reports"]),
                said(release["scorer"]),
                beside_base(release),
                said(release.get("gate")),
                _against_gate(release.get("below_gate")),
            ],
        )
        for release in summary.releases
    ]


def _against_gate(below: str | None) -> Cell:
    """Red where the release serves below what its gate predicted (issue 71: a greedy 6/7 at
    the gate, 1/26 live)."""
    return Text(f"below its gate: {below}", style="bold red") if below else "-"


def _last_step(step: dict[str, object] | None) -> str:
    if not step:
        return "-"
    finished = step.get("finished_at")
    at = cells.when(float(finished)) if isinstance(finished, int | float) else ""
    recipe = f"{step['recipe']}: " if step.get("recipe") else ""
    outcome = f"{recipe}{step.get('outcome')} {at}".strip()
    said = step.get("error") or step.get("detail")
    return f"{outcome}: {said}" if said else outcome


class ScenariosPane(Pane):
    def compose(self) -> ComposeResult:
        yield KeyedTable(COLUMNS, id="scenarios-table")
        yield KeyedTable(RELEASE_COLUMNS, id="releases-progress")
        yield VerticalScroll(id="curves")

    def fetch(self, source: ReviewSource) -> list[ScenarioSummary]:
        return source.scenarios()

    def show(self, data: list[ScenarioSummary]) -> None:
        self.query_one("#scenarios-table", KeyedTable).sync(
            [(s.scenario, scenario_cells(s)) for s in data]
        )
        rows = [row for summary in data for row in release_rows(summary)]
        self.query_one("#releases-progress", KeyedTable).sync(rows)
        curves = self.query_one("#curves", VerticalScroll)
        for summary in data:
            found = curves.query(f"#curve-{summary.scenario}")
            if found:
                found.first(ScoreCurve).show(summary)
            else:
                curves.mount(ScoreCurve(summary, id=f"curve-{summary.scenario}", classes="curve"))
