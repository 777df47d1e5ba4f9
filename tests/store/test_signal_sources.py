"""Who wrote a scenario's reports: its users, its teacher (demonstrations on the calls it took
over) or a batch imported from elsewhere, counted apart on SQLite and PostgreSQL. Before, one
count held them all ("12 reports" counted the teacher's own; issue 72)."""

from __future__ import annotations

from reef.cli.client_commands import _by_source
from reef.store import ExperienceStore, Record, Report
from reef.store.learning import signal_yield


def call(store: ExperienceStore, engine: str) -> str:
    record = Record(
        "default",
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"choices": [{"message": {"role": "assistant", "content": "Hello."}}]},
        engine=engine,
        release_id="base",
    )
    return store.add_record(record).result()


def test_reports_are_counted_by_who_wrote_them(store: ExperienceStore) -> None:
    served, taught = call(store, "llamacpp"), call(store, "llamacpp")
    imported = call(store, "import")
    store.add_report(Report("default", [served], score=0.0)).result()
    store.add_report(Report("default", [served], feedback="Shorter, please.")).result()
    teacher = {"source": "teacher", "reason": "the student's answer failed its check"}
    demonstration = {"demonstration": "Hello!"}
    store.add_report(Report("default", [taught], feedback=demonstration, metadata=teacher)).result()
    store.add_report(Report("default", [imported], score=1.0)).result()
    signal = signal_yield(store)["default"]
    assert signal["reports"] == 4
    assert signal["reports_by_source"] == {"user": 2, "teacher": 1, "imported": 1}
    assert _by_source(signal) == " (2 users', 1 the teacher's, 1 imported)"
    assert _by_source({"reports_by_source": {"user": 3, "teacher": 0, "imported": 0}}) == ""
