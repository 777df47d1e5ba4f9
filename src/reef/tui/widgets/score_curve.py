"""Feedback score over time as one line of bars, with release switches marked beneath."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from reef.review.rows import ScenarioSummary

BARS = "▁▂▃▄▅▆▇█"


def curve_text(summary: ScenarioSummary, width: int) -> Text:
    """One bar per bucket of reports (scores clamped to [0, 1]), and a `▲` under the bucket
    where each release was published, with its number."""
    points = summary.scores
    text = Text(f"{summary.scenario} feedback ", style="bold")
    if not points:
        return text.append("no scored reports yet", style="dim")
    buckets = max(1, min(width, len(points)))
    per = len(points) / buckets
    groups = [
        points[int(i * per) : max(int((i + 1) * per), int(i * per) + 1)] for i in range(buckets)
    ]
    for group in groups:
        mean = sum(min(max(p.score, 0.0), 1.0) for p in group) / len(group)
        text.append(BARS[round(mean * (len(BARS) - 1))], style="green" if mean >= 0.5 else "red")
    marks = [" "] * buckets
    for moment, _ in summary.switches:
        index = next((i for i, g in enumerate(groups) if g[-1].created_at >= moment), buckets - 1)
        marks[index] = "▲"
    labels = ", ".join(release for _, release in summary.switches)
    prefix = " " * len(f"{summary.scenario} feedback ")
    text.append("\n" + prefix + "".join(marks), style="yellow")
    return text.append(f"  releases: {labels}" if labels else "", style="yellow")


class ScoreCurve(Static):
    def __init__(self, summary: ScenarioSummary, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.summary = summary

    def on_mount(self) -> None:
        self.show(self.summary)

    def on_resize(self) -> None:
        self.show(self.summary)

    def show(self, summary: ScenarioSummary) -> None:
        self.summary = summary
        width = max(10, self.size.width - len(summary.scenario) - 12)
        self.update(curve_text(summary, width))
