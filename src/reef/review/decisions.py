"""What each decision will change, in words, for the confirmation dialogs."""

from __future__ import annotations

from textual.app import App

from reef.review.model import CandidateRow

DECIDABLE = ("held", "proposed")


def decidable(app: App[None], row: CandidateRow, becoming: str) -> bool:
    if row.state in DECIDABLE:
        return True
    app.notify(
        f"{row.id} is {row.state}: only a held or proposed candidate can be {becoming}",
        severity="warning",
    )
    return False


def approve_consequence(row: CandidateRow, head: str | None) -> str:
    base = row.base_release_id
    if head != base:
        return (
            f"It was evaluated against {base or 'the base model'}, but the head of "
            f"{row.scenario} is now {head or 'empty'}: approving will be refused. Reject it, "
            "or propose it again."
        )
    return (
        f"{row.scenario} will serve {row.id} ({row.kind}) as a new release on top of "
        f"{head or 'the base model'}, which stops serving."
    )


def reject_consequence(row: CandidateRow, head: str | None) -> str:
    return (
        f"{row.scenario} keeps serving {head or 'the base model'}; {row.id} is rejected for "
        "good. Why? (recorded with the decision)"
    )


def copy_consequence(release_id: str, scenario: str, head: str | None) -> str:
    return (
        f"{scenario} will serve a copy of {release_id} as a new release; "
        f"{head or 'the base model'} stops serving. The chain keeps every release."
    )
