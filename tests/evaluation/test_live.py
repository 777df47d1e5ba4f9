"""Is it learning: each release's pass rate on the live calls it answered, with its 95% Wilson
interval, from users' reports and from the recipe's scorer; in `/reef/status`, `reef status`
and `/metrics`, on Reef served in the test's process (a scripted engine) and real SQLite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from reef.cli import app
from reef.cli.client_commands import _below_gate_lines, _health_lines
from reef.evaluation.live import PassRate, below_gate, gate_estimate, live_progress, wilson
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec
from reef.inference.binding import Binding
from reef.protocol import ChatRequest
from reef.review.local_source import LocalSource
from reef.store import ExperienceStore, Record, Report
from reef.testing.in_process import reef_in_process
from reef.testing.scripted_engine import ScriptedEngine
from reef.tui.screens.scenarios_pane import release_rows
from tests.support.waiting import release_serving, until

CHEERS = ScorerSpec(type="regex", pattern=r"Cheers\W*$")


def call(store: ExperienceStore, release: str, answer: str, score: float | None) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": f"Q {answer}"}]},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="test",
        release_id=release,
    )
    record_id = store.add_record(record).result()
    if score is not None:
        store.add_report(Report("default", [record_id], score=score)).result()
    return record_id


def test_the_wilson_interval_reads_two_of_six_as_the_wide_guess_it_is() -> None:
    low, high = wilson(2, 6)
    assert low == pytest.approx(0.0968, abs=1e-3) and high == pytest.approx(0.7000, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    assert PassRate(2, 6).said() == "2/6 33% [10%-70%]" and PassRate(0, 0).said() == "-"


def test_each_release_is_judged_on_the_calls_it_answered(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path / "experience.db") as store:
        for answer, score in (("Four.", 0.0), ("Paris.", 0.0), ("Blue.", 1.0)):
            call(store, "base", answer, score)
        for answer, score in (("Six.\n\nCheers", 1.0), ("Rome.\n\nCheers", 1.0), ("Red.", None)):
            call(store, "default@1", answer, score)
        base, first = live_progress(store, "default", 0.5, CHEERS)
        # Read again only once a call or a report came: a new report changes the figures.
        assert live_progress(store, "default", 0.5, CHEERS)[1] == first
        call(store, "default@1", "Blue.", 0.0)
        grown = live_progress(store, "default", 0.5, CHEERS)[1]
    assert (grown.reports.count, grown.served) == (3, 4)
    assert base.release_id == "base" and first.release_id == "default@1"
    assert (base.reports.passed, base.reports.count, base.served) == (1, 3, 3)
    assert (first.reports.passed, first.reports.count, first.served) == (2, 2, 3)
    assert base.scorer is not None and (base.scorer.passed, base.scorer.count) == (0, 3)
    assert first.scorer is not None and (first.scorer.passed, first.scorer.count) == (2, 3)


def test_status_metrics_and_the_cli_say_whether_a_release_helps(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\n")
    with reef_in_process(tmp_path, ScriptedEngine("Four.")) as server:
        for _ in range(2):
            answered = httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "What is 2+2?"}]},
            )
            record_id = answered.headers["x-reef-agent-record-id"]
            reported = httpx.post(
                f"{server.url}/reef/report", json={"references": [record_id], "score": 0}
            )
            assert reported.status_code < 300, reported.text
        status = httpx.get(f"{server.url}/reef/status").json()
        (base,) = status["learning"]["scenarios"]["default"]["progress"]
        assert base["release_id"] == "base" and base["reports"]["passed"] == 0
        assert base["reports"]["count"] == 2 and base["reports"]["high"] < 0.9
        metrics = httpx.get(f"{server.url}/metrics").text
        assert (
            'reef:live_pass_rate_calls{release="base",scenario="default",signal="reports"} 2.0'
            in metrics
        )
        printed = subprocess.run(
            [sys.executable, "-m", "reef", "status", "--url", server.url],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "160"},
        ).stdout
    assert "live pass rate per release" in printed
    assert "0/2 0% [0%-66%]" in printed


STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# 20 words: cut at 3 tokens it is short (tests.support.scorers:short), whole it is not.
STORY_TOLD = (
    "Once upon a time a lighthouse keeper watched the sea every night and wrote down what the "
    "waves told him."
)


def test_the_base_shadows_a_share_of_a_release_s_calls_on_the_same_stream(
    tmp_path: Path,
) -> None:
    """With `gate.shadow.base_share`, the base model answers copies of the calls a release
    answered, never heard, scored by the same scorer: the release (its settings cap answers at
    3 tokens) passes the short-answer scorer, the base on the very same call does not."""
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\ngate:\n  policy: always\n  shadow:\n    base_share: 100\n"
        "    scorer: {type: python, function: 'tests.support.scorers:short'}\n"
    )
    with reef_in_process(tmp_path, ScriptedEngine(STORY_TOLD)) as server:
        workflow = server.state.workflow
        proposed = workflow.propose("default", "harness", {"settings.json": b'{"max_tokens": 3}'})
        assert workflow.approve(proposed.id, force=True).release_id == "default@1"
        until(lambda: release_serving(server.url) == "default@1")
        answered = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": STORY})
        assert answered.json()["choices"][0]["message"]["content"] == "Once upon a"
        assert answered.headers["x-reef-release-id"] == "default@1"

        def progress() -> dict:
            status = httpx.get(f"{server.url}/reef/status").json()
            return status["learning"]["scenarios"].get("default", {}).get("progress", [{}])[-1]

        until(lambda: (progress().get("base_shadow") or {}).get("count") == 1)
        release = progress()
        assert release["release_id"] == "default@1"
        assert (release["shadowed"]["passed"], release["base_shadow"]["passed"]) == (1, 0)
        status = httpx.get(f"{server.url}/reef/status").json()
        assert status["shadows"]["base:default"]["answered"] == 1




def test_a_release_serving_below_what_its_gate_predicted_is_said() -> None:
    """The gate's feedback estimate (samples passed on the `feedback` group) beside the live
    rate: issue 71's release went through at a greedy 6/7 and served 1/26 live."""
    evaluation = {
        "groups": {
            "correctness": {"answered": 48, "current_passes": 30, "candidate_passes": 31},
            "feedback": {"answered": 24, "current_passes": 2, "candidate_passes": 15},
        }
    }
    gate = gate_estimate(evaluation)
    assert gate == PassRate(15, 24)
    assert gate_estimate({"groups": {"feedback": {"tasks": 3, "candidate_mean": 0.6}}}) is None
    assert below_gate(gate, PassRate(1, 26)) == "gate predicted 62% [43%-79%], live 4% [1%-19%]"
    assert below_gate(gate, PassRate(9, 20)) is None  # inside the noise of both
    assert below_gate(None, PassRate(1, 26)) is None and below_gate(gate, PassRate(0, 0)) is None
    progress = {"default": {"progress": [{"release_id": "default@1", "below_gate": "x"}]}}
    assert _below_gate_lines(progress) == ["default: default@1 serves below its gate: x"]


def test_a_release_below_its_gate_is_flagged_in_status_metrics_and_the_review(
    tmp_path: Path,
) -> None:
    """A release the gate passed on the feedback at 21/24 that then serves 0/10 live: flagged
    in `/reef/status`, in `/metrics` (`reef:release_below_gate` 1 beside `reef:gate_pass_rate`),
    in the review's releases table and by `reef learning curve`."""
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\ngate:\n  min_tasks: 0\n")
    feedback = [
        EvalTask(
            id=f"f{n}",
            messages=[{"role": "user", "content": f"Sign off {n}."}],
            scorer=CHEERS,
            group=FEEDBACK_GROUP,
        )
        for n in range(3)
    ]

    async def generate(request: ChatRequest, binding: Binding) -> str:
        signs_off = binding.kind == "harness" and request.seed != 0  # 7 of 8 samples
        return "Four.\n\nCheers" if signs_off else "Four."

    with reef_in_process(tmp_path, ScriptedEngine("Four.")) as server:
        workflow = server.state.workflow
        proposed = workflow.propose("default", "harness", {"AGENTS.md": b"Sign off.\n"})
        gated = asyncio.run(workflow.gate(proposed, generate, extra_tasks=feedback))
        assert gated.state == "released", gated.decision
        until(lambda: release_serving(server.url) == "default@1")
        for _ in range(10):
            answered = httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "What is 2+2?"}]},
            )
            record_id = answered.headers["x-reef-agent-record-id"]
            httpx.post(f"{server.url}/reef/report", json={"references": [record_id], "score": 0})
        status = httpx.get(f"{server.url}/reef/status").json()
        (release,) = status["learning"]["scenarios"]["default"]["progress"]
        metrics = httpx.get(f"{server.url}/metrics").text
        source = LocalSource(server.state.config)
        (summary,) = source.scenarios()
        source.close()
    said = "gate predicted 88% [69%-96%], live 0% [0%-28%]"
    assert release["below_gate"] == said
    assert release["health"]["said"].startswith("held-out 0/24 -> 21/24 [")  # its transfer
    assert _health_lines(status["learning"]["scenarios"]) == [
        f"health default: default@1 {release['health']['said']}"
    ]
    assert 'reef:release_below_gate{release="default@1",scenario="default"} 1.0' in metrics
    assert 'reef:gate_pass_rate{release="default@1",scenario="default"} 0.875' in metrics
    (row,) = [cells for key, cells in release_rows(summary) if key == "default/default@1"]
    assert str(row[-1]) == f"below its gate: {said}" and row[-2] == "21/24 88% [69%-96%]"
    drawn = ["learning", "curve", "--out", str(tmp_path / "curve.png")]
    curve = CliRunner().invoke(app, [*drawn, "-c", str(tmp_path / "reef.yaml")])
    assert curve.exit_code == 0, curve.output
    assert f"default@1 serves below its gate: {said}" in curve.stdout
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
