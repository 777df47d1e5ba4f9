"""Candidates, the learning worker's bookkeeping and the review's queries, on both databases:
every statement of reef.store's other modules runs on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import pytest

from reef.errors import Conflict
from reef.store import ExperienceStore, Record, Report, learning, review
from reef.store.candidates import Candidate, CandidateStore


def served(store: ExperienceStore, text: str, scenario: str = "default") -> str:
    record = Record(
        scenario=scenario,
        request={"messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"{text}!"}}]},
        engine="test",
        release_id="base",
    )
    return store.add_record(record).result()


def candidate(store: ExperienceStore, records: list[str], source: str = "sft") -> Candidate:
    made = Candidate(
        "default", "lora", "/tmp/c", "base", source=source, consumed_record_ids=records
    )
    return CandidateStore(store).add(made)


def test_a_candidate_moves_through_its_states_and_keeps_its_fields(
    store: ExperienceStore,
) -> None:
    candidates = CandidateStore(store)
    made = candidate(store, [served(store, "a")])
    evaluation = {"current_mean": 0.25, "candidate_mean": 0.75, "lost": ["t1", "t2"]}
    moved = candidates.move(made.id, ("proposed",), "evaluating", evaluating_pid=42)
    assert (moved.state, moved.evaluating_pid) == ("evaluating", 42)
    done = candidates.move(
        made.id, ("evaluating",), "rejected", evaluation=evaluation, unjudged=True
    )
    assert done.evaluation == evaluation and done.unjudged and not done.records_returned
    with pytest.raises(Conflict, match="is rejected"):
        candidates.move(made.id, ("proposed",), "evaluating")
    assert candidates.decided_ids() == [made.id] and candidates.open_ids() == set()
    (row,) = review.candidate_rows(store, None, "default", 10)
    assert (row["current_mean"], row["candidate_mean"], row["lost"]) == (0.25, 0.75, 2)


def test_records_a_candidate_consumed_come_back_only_when_returned(
    store: ExperienceStore,
) -> None:
    candidates = CandidateStore(store)
    first, second = served(store, "a"), served(store, "b")
    held = candidate(store, [first], source="sft")
    candidate(store, [second], source="harness_evolve")
    assert candidates.consumed_record_ids("default") == {first, second}
    assert candidates.consumed_record_ids("default", source="sft") == {first}
    candidates.move(held.id, ("proposed",), "rejected", records_returned=True)
    assert candidates.consumed_record_ids("default") == {second}
    assert candidates.open_base_release_ids() == {"base"}


def test_the_workers_bookkeeping_round_trips(store: ExperienceStore) -> None:
    assert learning.take_instruction(store, "default") is None
    learning.queue_instruction(store, "default", "be brief")
    learning.queue_instruction(store, "default", "be kind")
    assert learning.take_instruction(store, "default") == "be brief"
    learning.save_counts(store, "default", waiting=3, consumed=1, stale_skipped=0)
    learning.save_counts(store, "default", waiting=5, consumed=2, stale_skipped=1)  # an update
    made = candidate(store, [served(store, "a")])
    CandidateStore(store).move(made.id, ("proposed",), "proposed", metrics={"loss": [2.0, 1.5]})
    steps = [("sft", "rejected", 12), ("harness_evolve", "released", 5), ("sft", "idle", None)]
    for recipe, outcome, calls in steps:
        step = {"scenario": "default", "recipe": recipe, "started_at": 1.0, "outcome": outcome}
        candidate_id = made.id if outcome == "idle" else None
        learning.save_step(store, {**step, "candidate_id": candidate_id, "metric_calls": calls})
    status = learning.learning_status(store)["default"]
    assert (status["waiting"], status["consumed"], status["stale_skipped"]) == (5, 2, 1)
    assert status["batches_built"] == 3
    assert status["last_step"]["outcome"] == "idle" and status["last_step"]["loss"] == [2.0, 1.5]
    assert status["recipes"]["sft"]["steps"] == 2
    assert status["recipes"]["sft"]["metric_calls"] == 12  # a step that counted none adds 0
    assert status["recipes"]["sft"]["last_step"]["metric_calls"] == 0
    assert status["recipes"]["harness_evolve"]["last_step"]["metric_calls"] == 5
    assert status["recipes"]["harness_evolve"]["last_step"]["outcome"] == "released"


def test_a_fingerprint_moves_with_each_record_report_and_candidate(
    store: ExperienceStore,
) -> None:
    seen = [learning.fingerprint(store, "default")]
    record_id = served(store, "a")
    seen.append(learning.fingerprint(store, "default"))
    store.add_report(Report("default", [record_id], score=1.0)).result()
    seen.append(learning.fingerprint(store, "default"))
    candidate(store, [record_id])
    seen.append(learning.fingerprint(store, "default"))
    assert len(set(seen)) == 4
    served(store, "b", scenario="other")
    assert learning.fingerprint(store, "default") == seen[-1]


def test_a_fingerprint_moves_when_a_candidate_is_decided_and_its_records_return(
    store: ExperienceStore,
) -> None:
    """A learner that looked while a record was held by a candidate in its gate must look again
    once the gate ends and the record is free: nothing new was stored meanwhile."""
    made = candidate(store, [served(store, "a")])
    candidates = CandidateStore(store)
    candidates.move(made.id, ("proposed",), "evaluating")
    seen = [learning.fingerprint(store, "default")]
    candidates.move(made.id, ("evaluating",), "rejected", records_returned=True)
    seen.append(learning.fingerprint(store, "default"))
    assert seen[0] != seen[1]


def test_annotations_and_the_reviews_record_queries(store: ExperienceStore) -> None:
    first, second = served(store, "50% off_sale"), served(store, "plain")
    learning.save_annotation(store, "default", "openclaw_rl", first, {"votes": [1, 0]})
    annotated = learning.with_annotations(store, [{"id": first}, {"id": second}])
    assert annotated[0]["annotations"][0]["votes"] == [1, 0] and annotated[1]["annotations"] == []
    store.add_report(Report("default", [second, first], score=0.5, feedback="meh")).result()
    store.add_report(Report("default", [first], score=1.0)).result()
    # % and _ are searched for as they are, not as LIKE's wildcards.
    assert [r["id"] for r in review.newest_records(store, "default", "50% off_", 10)] == [first]
    assert [r["id"] for r in review.newest_records(store, "default", "50% OFF", 10)] == [first]
    assert [r["id"] for r in review.newest_records(store, None, "", 10)] == [second, first]
    assert [r["score"] for r in review.reports_of(store, [first])] == [0.5, 1.0]
    assert review.recent_mean(store, "default", 10) == 0.75
    assert [r["score"] for r in review.recent_scores(store, "default", 1)] == [1.0]
    assert review.waiting_candidates(store, "default") == 0


def test_a_reports_references_keep_the_order_it_gave(store: ExperienceStore) -> None:
    ids = [served(store, text) for text in "cab"]
    stored, _ = store.add_report(Report("default", [ids[2], ids[0], ids[1]], score=1.0)).result()
    assert stored["references"] == [ids[2], ids[0], ids[1]]
