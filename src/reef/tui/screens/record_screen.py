"""One record: the whole exchange, what answered it, and its feedback."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from reef.protocol import message_text, response_text
from reef.review.queries import describe_report
from reef.review.rows import ReviewError
from reef.review.source import ReviewSource
from reef.tracing import TRACE_TAG

ROLE_STYLES = {"system": "magenta", "user": "bold cyan", "assistant": "bold green"}


def conversation(record: dict[str, Any]) -> Text:
    trace_id = ((record.get("metadata") or {}).get("tags") or {}).get(TRACE_TAG)
    text = Text.assemble(
        (record["id"], "bold"),
        f"  {record['scenario']} · served by {record['release_id']} · {record.get('engine', '')}",
        f" · {record.get('latency_ms') or 0:.0f} ms",
        f"\ntrace {trace_id}" if trace_id else "",
        "\n\n",
    )
    for message in record["request"].get("messages", []):
        role = str(message.get("role"))
        text.append(f"{role}\n", style=ROLE_STYLES.get(role, "bold"))
        text.append(message_text(message.get("content")) + "\n\n")
    text.append("answer\n", style=ROLE_STYLES["assistant"])
    text.append(response_text(record["response"]) + "\n\n")
    reports = record.get("reports") or []
    text.append("feedback\n", style="bold yellow")
    for report in reports:
        text.append(f"{report['id']}: {describe_report(report)}\n")
    if not reports:
        text.append("none yet\n", style="dim")
    return text


class RecordScreen(Screen[None]):
    AUTO_FOCUS = "VerticalScroll"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back", id="record.back")
    ]

    def __init__(self, record_id: str, source: ReviewSource) -> None:
        super().__init__()
        self.record_id = record_id
        self.source = source

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(f"loading {self.record_id}…", id="record-text")
        yield Footer()

    @work(thread=True)
    def on_mount(self) -> None:
        source = self.source
        try:
            found = conversation(source.record(self.record_id))
        except ReviewError as error:
            found = Text(error.message, style="red")
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            found = Text(f"cannot show {self.record_id}: {error}", style="red")
        self.app.call_from_thread(self.query_one("#record-text", Static).update, found)
