"""A chain's health, release by release (`reef.evaluation.health`): forgetting as Chaudhry et
al. define it (the best earlier score on a kept task less this release's) and transfer (the
held-out feedback before and after), read from the gates' evaluations, and shown by `reef
release list`.

The releases are made through the real release workflow and gate, on a scripted model whose
answer depends on the harness serving (its AGENTS.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from reef.cli import app
from reef.evaluation.health import Forgetting, Transfer, chain_health, forgetting
from reef.evaluation.tasks import FEEDBACK_GROUP
from reef.inference.binding import Binding
from reef.protocol import ChatRequest
from tests.releases.test_records_returned import workflow_in
from tests.support.gate_tasks import sign_off_tasks


def result(task: str, current: float, candidate: float, group: str = "default") -> dict:
    return {
        "task_id": task,
        "task_hash": f"hash-{task}",
        "group": group,
        "current_score": current,
        "candidate_score": candidate,
    }


def test_forgetting_is_the_best_earlier_score_less_this_release_s() -> None:
    chain = [
        ("s@1", {"results": [result("a", 0.5, 1.0), result("b", 1.0, 1.0)]}),
        ("s@2", None),  # released without a gate (a rollback's copy): nothing to say
        ("s@3", {"results": [result("a", 1.0, 0.25), result("b", 1.0, 1.0), result("c", 0, 1)]}),
        ("s@4", {"results": [result("f", 0.0, 1.0, FEEDBACK_GROUP)]}),  # held out: new each time
    ]
    found = forgetting(chain)
    assert found["s@1"] == Forgetting(mean=-0.25, tasks=2, fell=0, worst=None)  # against base
    # `a` reached 1.0 at s@1; `c` was first seen at s@3, against the release it replaced.
    # Mean drop: a 0.75, b 0, c -1 (it rose): a task that fell shows beside an average that did not.
    assert found["s@3"] == Forgetting(mean=-0.0833, tasks=3, fell=1, worst="a (1.00 -> 0.25)")
    assert "s@2" not in found and "s@4" not in found
    assert found["s@3"].said() == "1 of 3 task(s) fell (mean -0.08), most a (1.00 -> 0.25)"


def test_transfer_is_the_held_out_feedback_before_and_after() -> None:
    evaluation = {
        "groups": {FEEDBACK_GROUP: {"answered": 24, "current_passes": 2, "candidate_passes": 15}}
    }
    health = chain_health([("s@1", evaluation)])["s@1"]
    assert health.transfer == Transfer(before=2, after=15, count=24)
    assert health.said() == "held-out 2/24 -> 15/24 [+28%, +72%]"
    assert chain_health([("s@1", {"groups": {}})])["s@1"].said() == "-"


FEEDBACK = sign_off_tasks()
# What each harness says, whatever it is asked: v1 learned the sign-off; v2 kept the sign-off
# and forgot the capital (released anyway: this scenario's gate keeps no group).
SAYS = {"": "Paris.", "v1": "Paris. Cheers", "v2": "Lyon. Cheers"}
GATE = (
    "  policy: floor\n  floor: 0.5\n  groups:\n    default: {rule: any}\n"
    "    feedback: {rule: any}\n"
)


async def harness_says(request: ChatRequest, binding: Binding) -> str:
    return SAYS[(binding.system_prompt or "").strip()]


def test_reef_release_list_shows_each_release_s_health(tmp_path: Path) -> None:
    workflow = workflow_in(tmp_path, gate=GATE)
    try:
        for version in ("v1", "v2"):
            proposed = workflow.propose("default", "harness", {"AGENTS.md": version.encode()})
            gated = asyncio.run(workflow.gate(proposed, harness_says, extra_tasks=FEEDBACK))
            assert gated.state == "released", gated.decision
    finally:
        workflow.candidates.store.close()
    config = ["-c", str(tmp_path / "reef.yaml")]
    listed = CliRunner().invoke(app, ["release", "list", "--json", *config])
    assert listed.exit_code == 0, listed.output
    health = {r["release_id"]: r["health"] for r in json.loads(listed.stdout)}
    assert health["default@1"]["forgetting"]["fell"] == 0
    assert health["default@1"]["transfer"] == {
        "before": 0,
        "after": 24,
        "count": 24,
        "low": 0.8049,
        "high": 1.0,
    }
    assert health["default@2"]["forgetting"] == {
        "mean": 1.0,
        "tasks": 3,
        "fell": 3,
        "worst": "capital0 (1.00 -> 0.00)",
    }
    blocks = CliRunner().invoke(app, ["release", "list", *config])  # 80 columns: one block each
    assert (
        "health: 3 of 3 task(s) fell (mean +1.00), most capital0 (1.00 -> 0.00); "
        "held-out 24/24 -> 24/24" in " ".join(blocks.stdout.split())
    )
