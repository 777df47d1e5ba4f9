"""Honest figures (issue 72): a release's live pass rate counts what its own model answered.
Thirty records imported with any `release_id` made `shop@1` read 30/30, and the teacher's
answers counted as the student's (base 6/6 while the student never wrote the sign-off)."""

from __future__ import annotations

from pathlib import Path

import httpx

from reef.evaluation.live import read_progress
from reef.store import ExperienceStore, Record, Report
from reef.testing.in_process import reef_in_process

HI = [{"role": "user", "content": "Hi"}]


def envelope(record_id: str, release_id: str | None = None) -> dict:
    found = {
        "agent_record_id": record_id,
        "request_type": "inference",
        "payload": {
            "messages": HI,
            "response": {"choices": [{"message": {"role": "assistant", "content": "Hello."}}]},
        },
    }
    return {**found, "release_id": release_id} if release_id else found


def test_an_imported_record_naming_a_release_the_chain_lacks_is_refused(tmp_path: Path) -> None:
    with reef_in_process(tmp_path) as server:
        refused = httpx.post(
            f"{server.url}/reef/records/batch",
            json={"records": [envelope("imp-1"), envelope("imp-2", "default@7")]},
        )
        assert refused.status_code == 400, refused.text
        said = refused.json()["error"]["message"]
        assert "records[1]" in said and "'default@7' is not a release of scenario 'default'" in said
        assert server.state.store.latest_records("default") == []  # nothing of the batch stored
        base = httpx.post(f"{server.url}/reef/records/batch", json={"records": [envelope("i")]})
        assert base.status_code == 200 and base.json()["imported"] == 1


def served(store: ExperienceStore, engine: str = "llamacpp", arm: str | None = None) -> None:
    record = Record(
        scenario="default",
        request={"messages": HI},
        response={"choices": [{"message": {"role": "assistant", "content": "Hello."}}]},
        engine=engine,
        release_id="base",
        arm=arm,
    )
    record_id = store.add_record(record).result()
    store.add_report(Report("default", [record_id], score=1.0)).result()


def test_the_teacher_s_answers_and_imported_calls_are_not_the_release_s(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path / "experience.db") as store:
        served(store)
        served(store, arm="teacher")  # the student's answer failed; the teacher's was scored 1
        served(store, engine="import")  # made elsewhere
        (base,) = read_progress(store, "default", 0.5, None, 100)
    assert base.release_id == "base" and base.served == 2
    assert (base.reports.passed, base.reports.count) == (1, 2)


def test_an_imported_report_outside_the_score_range_is_refused_as_a_posted_one_is(
    tmp_path: Path,
) -> None:
    """POST /reef/report refuses a score of 5 on a 0-to-1 scenario; the import route was a road
    around that refusal, storing it and skewing every pass rate that reads it."""
    report = {
        "agent_record_id": "rep-1",
        "request_type": "report",
        "payload": {"references": ["imp-1"], "score": 5},
    }
    with reef_in_process(tmp_path) as server:
        refused = httpx.post(
            f"{server.url}/reef/records/batch", json={"records": [envelope("imp-1"), report]}
        )
        assert refused.status_code == 400, refused.text
        said = refused.json()["error"]["message"]
        assert "records[1]" in said and "outside default's score range [0, 1]" in said
        assert server.state.store.latest_records("default") == []
        inside = {**report, "payload": {**report["payload"], "score": 1}}
        kept = httpx.post(
            f"{server.url}/reef/records/batch", json={"records": [envelope("imp-1"), inside]}
        )
        assert kept.status_code == 200, kept.text
