"""Decisions from the dashboard: what each will change, in words, asked in a dialog, then done.

`DecisionFlow` carries out approve, reject, shadow, canary, roll back and promote for the app:
it checks the access and the candidate's state, reads the current heads, asks in a dialog what
will change, runs the change on the source, and says what happened (a conflict says what moved
since the screen was drawn); then everything is read again. The app runs each flow in a worker,
one at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from textual.app import App

from reef.review.rows import Access, CandidateRow, DecisionConflict, ReleaseRow, ReviewError
from reef.review.source import ReviewSource
from reef.tui.screens.dialogs import ConfirmDialog, TextDialog

DECIDABLE = ("held", "proposed")
ON_CANARY = "canary"
IN_SHADOW = "shadow"
CANARY_SHARE = "10"


def decidable(
    app: App[None], row: CandidateRow, becoming: str, states: tuple[str, ...] = DECIDABLE
) -> bool:
    if row.state in states:
        return True
    app.notify(
        f"{row.id} is {row.state}: only a {' or '.join(states)} candidate can be {becoming}",
        severity="warning",
    )
    return False


def canary_consequence(row: CandidateRow, head: str | None) -> str:
    serves = (
        f"{row.id} will serve this percent of {row.scenario}'s sessions, the rest staying on "
        f"{head or 'the base model'}; their reports will promote it or roll it back "
        "(gate.canary). Share of sessions, in percent:"
    )
    against = against_the_gate(row)
    return f"{against} {serves}" if against else serves


def shadow_consequence(row: CandidateRow) -> str:
    return (
        f"{row.id} will answer copies of {row.scenario}'s live chat calls on idle capacity; "
        "nobody hears its answers, which are kept beside the live ones (its Shadow tab). "
        "Approve or reject ends it."
    )


def canary_end_consequence(row: CandidateRow, promote: bool) -> str:
    if promote:
        return f"The canary ends now: {row.scenario} will serve {row.id} on every session."
    return f"The canary ends now: {row.scenario} goes back to the release before it."


def approve_consequence(row: CandidateRow, head: str | None) -> str:
    base = row.base_release_id
    if head != base:
        return (
            f"It was evaluated against {base or 'the base model'}, but the head of "
            f"{row.scenario} is now {head or 'empty'}: approving will be refused. Reject it, "
            f"or re-gate it against the new head: reef release regate {row.id}"
        )
    serves = (
        f"{row.scenario} will serve {row.id} ({row.kind}) as a new release on top of "
        f"{head or 'the base model'}, which stops serving."
    )
    against = against_the_gate(row)
    return f"{against} {serves}" if against else serves


def against_the_gate(row: CandidateRow) -> str | None:
    """What the reviewer's yes overrides (it is the --force), in words, or None."""
    if row.current_mean is None or row.candidate_mean is None:
        return "The gate never evaluated it."
    worse = scored_worse(row)
    return f"The gate scored it worse: it {worse}." if worse else None


def scored_worse(row: CandidateRow) -> str | None:
    """What the gate says the candidate loses against what served, in words, or None."""
    lost = f"lost {row.lost} task(s)" if row.lost else ""
    delta = row.delta
    if delta is not None and delta < 0:
        scores = f"scored {row.candidate_mean:.3f} against the current {row.current_mean:.3f}"
        return f"{scores} and {lost}" if lost else scores
    return lost or None


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


class DecisionFlow:
    def __init__(
        self,
        app: App[None],
        source: ReviewSource,
        access: Callable[[], Access | None],
        refresh: Callable[[], None],
    ) -> None:
        self.app = app
        self.source = source
        self.access = access  # what this token may do, once checked
        self.refresh = refresh  # read everything again

    def may_decide(self) -> bool:
        access = self.access()
        if access is not None and access.can_decide:
            return True
        why = access.why if access else "still checking what this token may do"
        self.app.notify(why, title="decisions are disabled", severity="warning")
        return False

    async def approve(self, row: CandidateRow) -> None:
        states = (*DECIDABLE, ON_CANARY, IN_SHADOW)
        if not self.may_decide() or not decidable(self.app, row, "approved", states):
            return
        head = (await self._heads()).get(row.scenario)
        if row.state == ON_CANARY:
            dialog = ConfirmDialog(f"Promote {row.id}?", canary_end_consequence(row, True))
        else:
            dialog = ConfirmDialog(f"Approve {row.id}?", approve_consequence(row, head))
        if await self.app.push_screen_wait(dialog):
            await self._decide(
                # Told in the dialog what it loses, the reviewer's yes is the --force.
                lambda: self.source.approve(row.id, head, force=True),
                lambda release: f"{row.id} is released as {release}: {row.scenario} serves it",
            )

    async def reject(self, row: CandidateRow) -> None:
        states = (*DECIDABLE, ON_CANARY, IN_SHADOW)
        if not self.may_decide() or not decidable(self.app, row, "rejected", states):
            return
        head = (await self._heads()).get(row.scenario)
        if row.state == ON_CANARY:
            consequence = f"{canary_end_consequence(row, False)} Why? (recorded with it)"
        else:
            consequence = reject_consequence(row, head)
        dialog = TextDialog(f"Reject {row.id}?", consequence)
        reason = await self.app.push_screen_wait(dialog)
        if reason:
            await self._decide(
                lambda: self.source.reject(row.id, reason),
                lambda _: f"{row.id} is rejected: {reason}",
            )

    async def shadow(self, row: CandidateRow) -> None:
        if not self.may_decide() or not decidable(self.app, row, "put in shadow"):
            return
        if await self.app.push_screen_wait(
            ConfirmDialog(f"Shadow {row.id}?", shadow_consequence(row))
        ):
            await self._decide(
                lambda: self.source.shadow(row.id),
                lambda _: f"{row.id} answers copies of {row.scenario}'s live calls",
            )

    async def canary(self, row: CandidateRow) -> None:
        if not self.may_decide() or not decidable(self.app, row, "put on a canary"):
            return
        head = (await self._heads()).get(row.scenario)
        dialog = TextDialog(f"Canary {row.id}?", canary_consequence(row, head), CANARY_SHARE)
        answer = await self.app.push_screen_wait(dialog)
        if not answer:
            return
        if not answer.strip().isdigit() or not 1 <= int(answer) <= 99:
            self.app.notify(
                f"a share is a whole percent, 1 to 99, not {answer!r}", severity="error"
            )
            return
        share = int(answer)
        await self._decide(
            # Told in the dialog what it loses, the reviewer's share is the --force.
            lambda: self.source.canary(row.id, share, force=True),
            lambda release: f"{row.id} serves {share}% of {row.scenario}'s sessions ({release})",
        )

    async def rollback(self, row: ReleaseRow) -> None:
        if not self.may_decide():
            return
        head = (await self._heads()).get(row.scenario)
        if head == row.release_id:
            self.app.notify(f"{row.release_id} is the head of {row.scenario} already")
            return
        consequence = copy_consequence(row.release_id, row.scenario, head)
        if await self.app.push_screen_wait(
            ConfirmDialog(f"Roll back to {row.release_id}?", consequence)
        ):
            await self._decide(
                lambda: self.source.rollback(row.scenario, row.release_id, head),
                lambda release: f"{row.scenario} serves {release}, a copy of {row.release_id}",
            )

    async def promote(self, row: ReleaseRow) -> None:
        if not self.may_decide():
            return
        prompt = f"Into which scenario should {row.release_id} be promoted?"
        target = await self.app.push_screen_wait(TextDialog("Promote", prompt, row.scenario))
        if not target:
            return
        head = (await self._heads()).get(target)
        consequence = copy_consequence(row.release_id, target, head)
        if await self.app.push_screen_wait(
            ConfirmDialog(f"Promote {row.release_id}?", consequence)
        ):
            await self._decide(
                lambda: self.source.promote(row.release_id, target, head),
                lambda release: f"{target} serves {release}, a copy of {row.release_id}",
            )

    async def _heads(self) -> dict[str, str | None]:
        try:
            return await asyncio.to_thread(self.source.heads)
        except ReviewError as error:
            self.app.notify(error.message, severity="error")
            return {}

    async def _decide(self, action: Callable[[], str | None], done: Callable[[Any], str]) -> None:
        """Run a decision; a conflict says what moved, and everything is read again."""
        try:
            result = await asyncio.to_thread(action)
        except DecisionConflict as conflict:
            self.app.notify(
                f"{conflict.message}. Nothing was changed; the screen is refreshed.",
                title="conflict: it changed since the screen was drawn",
                severity="error",
                timeout=15,
            )
        except ReviewError as error:
            self.app.notify(error.message, title="not done", severity="error", timeout=15)
        else:
            self.app.notify(done(result), title="done", timeout=8)
        self.refresh()
