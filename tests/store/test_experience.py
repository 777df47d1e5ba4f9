"""Experience processing for every recipe: sessions, next state, dedup, consumption, staleness."""

from __future__ import annotations

from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore, Record, Report


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def call(
    store: ExperienceStore,
    messages: list[dict],
    answer: str,
    session: str | None = None,
    release_id: str = "base",
) -> str:
    record = Record(
        scenario="default",
        session=session,
        request={"messages": messages},
        response={"choices": [{"message": assistant(answer)}]},
        engine="test",
        release_id=release_id,
    )
    return store.add_record(record).result()


def view(store: ExperienceStore, **kwargs: object) -> ExperienceView:
    return ExperienceView(store, "default", consumed=kwargs.pop("consumed", set()), **kwargs)  # type: ignore[arg-type]


def test_calls_extending_earlier_messages_are_one_trajectory_with_next_states(
    store: ExperienceStore,
) -> None:
    first = call(store, [user("Hi")], "Hello!")
    second = call(store, [user("Hi"), assistant("Hello!"), user("Tell me a joke")], "Why...")
    other = call(store, [user("Unrelated")], "Sure.")
    trajectories = view(store).trajectories
    assert [t.record_ids for t in trajectories] == [[first, second], [other]]
    opening, follow_up = trajectories[0].turns
    assert opening.next_state == [user("Tell me a joke")]
    assert follow_up.next_state is None


def test_session_header_groups_calls(store: ExperienceStore) -> None:
    a = call(store, [user("one")], "1", session="s")
    call(store, [user("other")], "x")
    b = call(store, [user("two")], "2", session="s")
    assert view(store).trajectories[0].record_ids == [a, b]


def test_identical_retries_count_once_with_all_their_feedback(store: ExperienceStore) -> None:
    first = call(store, [user("Same question")], "answer 1")
    retry = call(store, [user("Same question")], "answer 2")
    store.add_report(Report("default", [first], score=0.0)).result()
    store.add_report(Report("default", [retry], feedback="still wrong")).result()
    turns = view(store).turns()
    assert [t.record_id for t in turns] == [retry]
    assert turns[0].score == 0.0 and turns[0].feedback == ["still wrong"]


def test_consumed_and_stale_records_are_skipped_and_counted(store: ExperienceStore) -> None:
    old = call(store, [user("a")], "x", release_id="default@1")
    used = call(store, [user("b")], "y", release_id="default@4")
    fresh = call(store, [user("c")], "z", release_id="default@4")
    seen = view(store, consumed={used}, head_number=5, max_staleness=2)
    assert [t.record_ids for t in seen.trajectories] == [[fresh]]
    assert (seen.counts.waiting, seen.counts.consumed, seen.counts.stale_skipped) == (1, 1, 1)
    assert old not in {r for t in seen.trajectories for r in t.record_ids}


def test_identical_first_turns_of_different_sessions_stay_apart(store: ExperienceStore) -> None:
    a = call(store, [user("Hi")], "Hello from a", session="a")
    b = call(store, [user("Hi")], "Hello from b", session="b")
    store.add_report(Report("default", [a], score=1.0, feedback="good")).result()
    store.add_report(Report("default", [b], score=0.0, feedback="bad")).result()
    turns = {turn.record_id: turn for turn in view(store).turns()}
    assert set(turns) == {a, b}
    assert (turns[a].score, turns[a].feedback) == (1.0, ["good"])
    assert (turns[b].score, turns[b].feedback) == (0.0, ["bad"])


def test_a_retry_within_a_session_still_counts_once(store: ExperienceStore) -> None:
    first = call(store, [user("Same question")], "answer 1", session="s")
    retry = call(store, [user("Same question")], "answer 2", session="s")
    store.add_report(Report("default", [first], score=0.0)).result()
    turns = view(store).turns()
    assert [t.record_id for t in turns] == [retry] and turns[0].score == 0.0


def test_records_hashed_without_their_session_still_keep_sessions_apart(
    store: ExperienceStore,
) -> None:
    """Rows stored before the hash included the session share one hash across sessions."""
    ids = []
    for session in ("a", "b"):
        record = Record(
            scenario="default",
            session=session,
            request={"messages": [user("Hi")]},
            response={"choices": [{"message": assistant("Hello")}]},
            engine="test",
            release_id="base",
            content_hash="hash-from-before-sessions-counted",
        )
        ids.append(store.add_record(record).result())
    assert sorted(t.record_id for t in view(store).turns()) == sorted(ids)
