"""`reef records --search`: records found by the words of what was asked or answered, over an
index (a contentless FTS5 index on SQLite, a GIN-indexed table on PostgreSQL) that a search
first brings up to date with the records stored since the last one, on both databases."""

from __future__ import annotations

from reef.store import ExperienceStore, Record

CALLS = [
    ("What is the capital of France?", "Paris."),
    ("Name a fruit.", "A pear."),
    ("What's up?", 'Nothing "much", and you?'),
]


def store_calls(store: ExperienceStore) -> None:
    for asked, answered in CALLS:
        record = Record(
            "default",
            {"messages": [{"role": "user", "content": asked}]},
            {"choices": [{"message": {"role": "assistant", "content": answered}}]},
            engine="test",
            release_id="base",
        )
        store.add_record(record).result()


def asked(records: list[dict]) -> list[str]:
    return [record["request"]["messages"][0]["content"] for record in records]


def test_records_are_found_by_their_words(store: ExperienceStore) -> None:
    store_calls(store)
    assert asked(store.latest_records(search="paris")) == ["What is the capital of France?"]
    assert asked(store.latest_records(search="France capital")) == [CALLS[0][0]]  # every word
    assert asked(store.list_records(search="pear")) == ["Name a fruit."]
    assert store.latest_records(search="pear paris") == []
    assert store.latest_records(search="zebra") == []
    # A user's words, not a query language: quotes, OR, a colon or a star are words.
    assert asked(store.latest_records(search='much" OR')) == []
    assert asked(store.latest_records(search='"much"')) == [CALLS[2][0]]
    assert store.latest_records(search="NEAR: *") == []
    assert len(store.latest_records(search="  ")) == 3  # no words: no filter
    assert asked(store.latest_records(search="\x00paris\x07")) == [CALLS[0][0]]  # no NUL
    assert asked(store.latest_records(scenario="other", search="paris")) == []


def test_a_record_stored_after_a_search_is_found_by_the_next(store: ExperienceStore) -> None:
    store_calls(store)
    assert store.latest_records(search="lamp") == []
    record = Record(
        "default",
        {"messages": [{"role": "user", "content": "Which lamp for reading?"}]},
        {"choices": [{"message": {"role": "assistant", "content": "A floor lamp."}}]},
        engine="test",
        release_id="base",
    )
    store.add_record(record).result()
    assert asked(store.latest_records(search="lamp")) == ["Which lamp for reading?"]
    assert asked(store.latest_records(search="paris")) == [CALLS[0][0]]  # indexed once
