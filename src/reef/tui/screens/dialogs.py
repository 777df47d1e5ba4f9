"""Small modal dialogs: confirm a decision, type a reason, name a target scenario."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class ConfirmDialog(ModalScreen[bool]):
    """Yes or no, saying exactly what will serve afterwards."""

    AUTO_FOCUS = "#yes"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="dialog.yes"),
        Binding("n,escape", "answer(False)", "No", id="dialog.no"),
    ]

    def __init__(self, title: str, consequence: str) -> None:
        super().__init__()
        self.title_text = title
        self.consequence = consequence

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Label(self.consequence, id="consequence")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", variant="primary", id="yes")
                yield Button("No (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class TextDialog(ModalScreen[str | None]):
    """One line of text (a reason, a scenario); None when cancelled, never empty."""

    AUTO_FOCUS = "#dialog-input"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel")
    ]

    def __init__(self, title: str, prompt: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.title_text, self.prompt, self.value, self.placeholder = (
            title,
            prompt,
            value,
            placeholder,
        )

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Label(self.prompt)
            yield Input(self.value, placeholder=self.placeholder, id="dialog-input")
            yield Label("enter to confirm, escape to cancel", classes="dim")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.dismiss(text)
        else:
            self.notify("type something first, or escape to cancel", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)
