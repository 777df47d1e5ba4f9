"""docs/observability.md and the Grafana dashboard name only metrics that exist: every `reef:`
name the dashboard queries is documented, and every documented name is one the server exports
(its families, as prometheus-client names them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
SOURCES = Path(__file__).resolve().parents[2] / "src/reef/server"
NAME = re.compile(r"reef:[a-z0-9_]+")
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info")


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_the_dashboard_queries_documented_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-reef.json").read_text())
    queried = {
        family(name)
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in NAME.findall(target["expr"])
    }
    documented = {family(name) for name in NAME.findall((DOCS / "observability.md").read_text())}
    assert queried and queried <= documented, queried - documented


def test_every_documented_metric_is_defined_in_the_server() -> None:
    documented = {family(name) for name in NAME.findall((DOCS / "observability.md").read_text())}
    source = "".join((SOURCES / path).read_text() for path in ("metrics.py", "reef_api/metrics.py"))
    defined = {f"reef:{name}" for name in re.findall(r'\{PREFIX\}([a-z0-9_]+)"', source)}
    assert documented <= defined, documented - defined
