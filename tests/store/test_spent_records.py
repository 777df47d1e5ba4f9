"""Records a recipe's step learned nothing from are set aside for that recipe, until a new
report on one, on SQLite and PostgreSQL (`reef.store.learning.spend_records`)."""

from __future__ import annotations

from reef.store import ExperienceStore, Record, Report
from reef.store.learning import fingerprint, spend_records, spent_record_ids


def call(store: ExperienceStore, text: str) -> str:
    record = Record(
        "default",
        {"messages": [{"role": "user", "content": text}]},
        {"choices": [{"message": {"role": "assistant", "content": "Hello."}}]},
        engine="test",
        release_id="base",
    )
    record_id = store.add_record(record).result()
    store.add_report(Report("default", [record_id], score=0.0)).result()
    return record_id


def test_spent_records_wait_for_a_new_report(store: ExperienceStore) -> None:
    first, second = call(store, "Hi"), call(store, "Hey")
    before = fingerprint(store, "default")
    spend_records(store, "default", "sft", [first, second])
    assert fingerprint(store, "default") != before  # the next step tries another batch
    assert spent_record_ids(store, "default", "sft") == {first, second}
    assert spent_record_ids(store, "default", "harness_evolve") == set()  # per recipe
    store.add_report(Report("default", [first], feedback="Say hello back.")).result()
    assert spent_record_ids(store, "default", "sft") == {second}
    spend_records(store, "default", "sft", [first])  # tried again, and spent again
    assert spent_record_ids(store, "default", "sft") == {first, second}
