"""`?`: what the review shows and which keys do what."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# reef review

**Tabs**: `1` candidates · `2` scenarios · `3` releases · `4` records. The tables follow the
stores live (every second); the cursor stays on the row you selected.

**Candidates**: held candidates first, then newest first. `enter` opens one: the evaluation task
by task, the diff against its parent release, weights and training loss, the records it was built
from, each a tab: `]` shows the next tab and `[` the previous one (the arrows move between tabs
once the tab row has the focus: `shift+tab` gives it). `a` approves (it becomes a new release
and serves; the confirmation says what the gate found it loses), `r` rejects with a reason, `c`
puts it on a canary (a share of sessions, judged on their reports; its summary shows the arms, the
estimate and what happens next), `h` puts it in shadow (it answers copies of live calls, never
heard; its Shadow tab shows them beside the live answers), `s` cycles the state filter, `/`
filters the rows by text. On a canary, `a` promotes it and `r` rolls it back.

**Releases**: `enter` shows a release's diff against its parent. `b` rolls its scenario back to
the selected release, `p` promotes it (into its own scenario or another); both publish a new
release, the chain is never rewritten.

**Records**: `/` searches prompts and answers; `enter` opens the whole exchange and its feedback.

Every decision asks first and names what will serve afterwards. When the head moved since the
screen was drawn (another reviewer, the learning worker, `reef release`), nothing changes: you
see the conflict and the screen refreshes. With an inference-only token (`--url`), decisions are
disabled: `REEF_ADMIN_TOKEN` enables them.

`ctrl+p` lists every action · `ctrl+r` refreshes · `escape` goes back · `q` quits.
"""


class HelpScreen(ModalScreen[None]):
    AUTO_FOCUS = "VerticalScroll"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss_help", "Close", id="help.close")
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Markdown(HELP)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
