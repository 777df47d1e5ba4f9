"""`gate.confirm_live`: a recipe's candidate the gate released for a gain on its users'
feedback goes to a canary first, and live traffic confirms it (issue 71: a gate's 6/7 served
1/26 live). A human's publish, and a candidate judged on no feedback, release as the gate said.

Through the real release workflow and chain, on a scripted model whose answer depends on the
harness serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.artifacts import ROUTING_FILE
from reef.evaluation.tasks import EvalTask
from reef.inference.binding import Binding
from reef.protocol import ChatRequest
from reef.releases.workflow import ReleaseWorkflow
from reef.store.candidates import Candidate
from tests.releases.test_records_returned import workflow_in
from tests.support.gate_tasks import sign_off_tasks

FEEDBACK = sign_off_tasks()
# The same prompts as the scenario's own tasks: a gain the users' feedback did not ask for.
OWN = sign_off_tasks(group="default")


async def signs_off(request: ChatRequest, binding: Binding) -> str:
    """The base answers the capital; the candidate (a harness) signs off too."""
    return "Paris. Cheers" if binding.kind == "harness" else "Paris."


def gated(
    folder: Path, source: str, extra: list[EvalTask], confirm: bool = True
) -> tuple[Candidate, ReleaseWorkflow]:
    workflow = workflow_in(folder, gate=f"  confirm_live: {str(confirm).lower()}\n")
    proposed = workflow.propose("default", "harness", {"AGENTS.md": b"Sign off.\n"}, source)
    return asyncio.run(workflow.gate(proposed, signs_off, extra_tasks=extra)), workflow


def test_a_recipe_s_feedback_gain_is_confirmed_live_on_a_canary(tmp_path: Path) -> None:
    candidate, workflow = gated(tmp_path, "sft", FEEDBACK)
    try:
        assert candidate.state == "canary", candidate.decision
        assert "to be confirmed live: a canary on 10% (gate.confirm_live)" in (
            candidate.decision or ""
        )
        release = workflow.chain.get(candidate.release_id or "")
        routing = workflow.chain.files(release.release_id)[ROUTING_FILE].decode()
        assert "release: base" in routing and "share: 10" in routing
        assert release.evaluation is not None  # the gate's evidence travels with it
    finally:
        workflow.candidates.store.close()


@pytest.mark.parametrize(
    ("source", "extra", "confirm"),
    [
        ("cli", FEEDBACK, True),  # a human published it: the human decided
        ("sft", OWN, True),  # judged on no feedback: nothing for live traffic to confirm
        ("sft", FEEDBACK, False),  # the scenario does not ask for it
    ],
)
def test_other_releases_serve_everyone_as_the_gate_said(
    tmp_path: Path, source: str, extra: list[EvalTask], confirm: bool
) -> None:
    candidate, workflow = gated(tmp_path, source, extra, confirm)
    workflow.candidates.store.close()
    assert candidate.state == "released", candidate.decision
    assert "confirmed live" not in (candidate.decision or "")
