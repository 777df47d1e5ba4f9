"""A report whose metadata says `{"training": {"eligible": false}}` is stored and shown, and never
learned from: not by a recipe (the experience view) and not as a replayed good answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.evaluation.replay import good
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore, Record, Report

INELIGIBLE = {"training": {"eligible": False}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ExperienceStore]:
    with ExperienceStore(tmp_path / "experience.db") as opened:
        yield opened


def a_call(store: ExperienceStore, question: str) -> str:
    record = Record(
        scenario="default",
        session=None,
        request={"messages": [{"role": "user", "content": question}]},
        response={"choices": [{"message": {"role": "assistant", "content": "4"}}]},
        engine="test",
        release_id="base",
    )
    return store.add_record(record).result()


def test_an_ineligible_report_is_stored_but_never_reaches_learning(store: ExperienceStore) -> None:
    kept, left_out = a_call(store, "2+2?"), a_call(store, "3+1?")
    store.add_report(Report("default", [kept], score=1.0, feedback="right")).result()
    report = Report("default", [left_out], score=0.0, feedback="wrong", metadata=INELIGIBLE)
    stored, created = store.add_report(report).result()
    assert created and stored["metadata"] == INELIGIBLE  # stored as sent

    turns = {
        turn.record_id: turn for turn in ExperienceView(store, "default", consumed=set()).turns()
    }
    assert turns[kept].score == 1.0 and turns[kept].feedback == ["right"]
    assert turns[left_out].score is None and turns[left_out].feedback == []


def test_an_ineligible_score_does_not_make_a_good_answer_to_replay() -> None:
    eligible = {"score": 1.0, "metadata": {}}
    assert good({"reports": [eligible]}, threshold=0.5)
    assert not good({"reports": [{**eligible, "metadata": INELIGIBLE}]}, threshold=0.5)
    # other metadata, or eligible: true, trains as before
    assert good({"reports": [{"score": 1.0, "metadata": {"training": {"eligible": True}}}]}, 0.5)
    assert good({"reports": [{"score": 1.0, "metadata": {"by": "judge"}}]}, 0.5)
