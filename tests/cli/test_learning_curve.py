"""`reef learning curve`, the real CLI (in process) on a project's real SQLite store: each
release's live pass rate, printed and drawn as a PNG."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from reef.cli import app
from reef.store import ExperienceStore, Record, Report


def served(store: ExperienceStore, release: str, score: float) -> None:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": "What is 2+2?"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "4"}}]},
        engine="test",
        release_id=release,
    )
    store.add_record(record).result()
    store.add_report(Report("default", [record.id], score=score)).result()


def test_the_curve_is_drawn_and_each_release_s_pass_rate_said(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text("{}\n")
    with ExperienceStore(tmp_path / ".reef/experience.db") as store:
        for score in (0.0, 0.0, 1.0):
            served(store, "base", score)
        for score in (1.0, 1.0, 1.0, 0.0):
            served(store, "default@1", score)
    config = ["-c", str(tmp_path / "reef.yaml")]
    drawn = ["learning", "curve", "--out", str(tmp_path / "curve.png"), *config]
    result = CliRunner().invoke(app, drawn)
    assert result.exit_code == 0, result.output
    assert "base: 1/3 reports passed (6%-79%)" in result.stdout
    assert "default@1: 3/4 reports passed (30%-95%)" in result.stdout
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = CliRunner().invoke(app, ["learning", "curve", "--scenario", "support", *config])
    assert missing.exit_code == 1
    assert "no records or releases for scenario 'support'" in missing.output
