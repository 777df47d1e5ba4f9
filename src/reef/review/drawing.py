"""A scenario's learning curve as a PNG: is the release that serves helping on live traffic?

The feedback score of each scored call over time (its rolling mean), a dashed line where each
release began serving, and each release's live pass rate (`reef.evaluation.live`) as a level
across the time it served, shaded by its 95% interval, with what its gate predicted on the
feedback dotted beside it (red, and said in the corner, where live fell below it). Drawn with
matplotlib (`reef[plot]`), imported only here.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from reef.errors import ReefError
from reef.review.rows import ScenarioSummary

ROLLING = 10  # scored calls the curve's rolling mean is over


class PlotUnavailable(ReefError):
    status = 400
    code = "plot_unavailable"


def rolling_mean(scores: list[float], window: int = ROLLING) -> list[float]:
    """The mean of each score with up to `window - 1` before it (scores clamped to 0..1)."""
    clamped = [min(max(score, 0.0), 1.0) for score in scores]
    return [
        sum(clamped[max(0, i - window + 1) : i + 1]) / len(clamped[max(0, i - window + 1) : i + 1])
        for i in range(len(clamped))
    ]


def draw_learning_curve(summary: ScenarioSummary, path: Path) -> Path:
    """Draw `summary`'s learning curve into `path` (a PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "reef learning curve draws with matplotlib: pip install 'reef[plot]'"
        ) from None
    figure = plt.figure(figsize=(9, 4.5))
    axis: Any = figure.add_subplot()  # matplotlib's stubs take no datetimes; it plots them
    times = [datetime.fromtimestamp(point.created_at) for point in summary.scores]
    if times:
        means = rolling_mean([point.score for point in summary.scores])
        axis.plot(times, means, color="tab:blue", label=f"feedback score (mean of {ROLLING})")
    ends = [release["first_at"] for release in summary.releases[1:]]
    now = max([p.created_at for p in summary.scores] or [0.0])
    for release, end in zip(summary.releases, [*ends, now], strict=True):
        _pass_rate_band(axis, release, end)
        _gate_level(axis, release, end)
    for moment, release_id in summary.switches:
        axis.axvline(datetime.fromtimestamp(moment), color="tab:orange", linestyle="--")
        axis.annotate(release_id, (datetime.fromtimestamp(moment), 1.02), fontsize=8)
    below = [
        f"{r['release_id']}: {r['below_gate']}" for r in summary.releases if r.get("below_gate")
    ]
    if below:
        flagged = "serves below its gate\n" + "\n".join(below)
        axis.text(
            0.01, 0.97, flagged, transform=axis.transAxes, va="top", color="tab:red", fontsize=8
        )
    axis.set_ylim(0, 1.08)
    axis.set_ylabel("pass rate / score")
    axis.set_title(f"{summary.scenario}: live feedback per release (shaded: 95% interval)")
    axis.legend(loc="lower right", fontsize=8)
    figure.autofmt_xdate()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _gate_level(axis: Any, release: dict[str, Any], end: float) -> None:
    """What the release's gate predicted on the feedback (its sampled pass rate there), dotted
    over the time it served: live should lie within reach of it."""
    gate = release.get("gate")
    if not gate or not gate["count"]:
        return
    start, stop = datetime.fromtimestamp(release["first_at"]), datetime.fromtimestamp(end)
    color = "tab:red" if release.get("below_gate") else "tab:purple"
    axis.hlines(gate["rate"], start, stop, color=color, linestyle=":", linewidth=1.5)


def _pass_rate_band(axis: Any, release: dict[str, Any], end: float) -> None:
    """A release's reports pass rate as a level over the time it served, its interval shaded."""
    found = release["reports"]
    if not found["count"]:
        return
    start, stop = datetime.fromtimestamp(release["first_at"]), datetime.fromtimestamp(end)
    rate = found["passed"] / found["count"]
    label = f"{release['release_id']}: {found['passed']}/{found['count']}"
    axis.hlines(rate, start, stop, color="tab:green", linewidth=2)
    axis.fill_between([start, stop], found["low"], found["high"], color="tab:green", alpha=0.15)
    axis.annotate(label, (start, rate), textcoords="offset points", xytext=(2, 4), fontsize=8)
