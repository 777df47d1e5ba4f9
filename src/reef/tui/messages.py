"""What a pane or a screen asks the app for: a decision, another screen, or a fresh read.

Widgets post these and the app handles them (`ReviewApp.on_…`), so no widget needs the app's
class: panes and screens depend on the app only through the messages they send.
"""

from __future__ import annotations

from textual.message import Message

from reef.review.rows import CandidateRow, ReleaseRow


class Approve(Message):
    def __init__(self, row: CandidateRow) -> None:
        super().__init__()
        self.row = row


class Reject(Message):
    def __init__(self, row: CandidateRow) -> None:
        super().__init__()
        self.row = row


class StartCanary(Message):
    def __init__(self, row: CandidateRow) -> None:
        super().__init__()
        self.row = row


class StartShadow(Message):
    def __init__(self, row: CandidateRow) -> None:
        super().__init__()
        self.row = row


class RollBack(Message):
    def __init__(self, row: ReleaseRow) -> None:
        super().__init__()
        self.row = row


class Promote(Message):
    def __init__(self, row: ReleaseRow) -> None:
        super().__init__()
        self.row = row


class OpenCandidate(Message):
    def __init__(self, candidate_id: str) -> None:
        super().__init__()
        self.candidate_id = candidate_id


class OpenRecord(Message):
    def __init__(self, record_id: str) -> None:
        super().__init__()
        self.record_id = record_id


class OpenReleaseDiff(Message):
    def __init__(self, release_id: str) -> None:
        super().__init__()
        self.release_id = release_id


class ReadAgain(Message):
    """What the pane shows changed its filter: poll now rather than at the next tick."""
