"""The learning worker's bookkeeping in experience.db: its status, its steps, queued instructions.

The worker writes these; the server reads them for `/reef/status` and queues `reef train`
instructions. SQL lives here, in the store layer, so neither has to import the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reef.errors import Conflict
from reef.store.candidates import OPEN_STATES
from reef.store.database import Database
from reef.store.experience import ExperienceStore, new_id
from reef.store.leases import lease_holders


def queue_instruction(
    store: ExperienceStore,
    scenario: str,
    instruction: str,
    provenance: dict[str, Any] | None = None,
) -> str:
    """Queue a `reef train` instruction for the worker; returns its id. `provenance`: where it
    came from (`POST /reef/train`'s session, release_id and requires)."""
    request_id = new_id("train")
    row = _request_row(request_id, scenario, instruction, provenance)
    store.write(lambda db: db.insert("train_requests", row)).result()
    return request_id


def _request_row(
    request_id: str, scenario: str, instruction: str, provenance: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": request_id,
        "scenario": scenario,
        "instruction": instruction,
        "created_at": time.time(),
        "provenance": json.dumps(provenance) if provenance else None,
    }


@dataclass(frozen=True)
class QueuedInstruction:
    """An instruction a worker took: its id, its text, and where it came from (the id, session,
    release_id and requires it was sent with; None for `reef train`'s plain instructions)."""

    id: str
    text: str
    provenance: dict[str, Any] | None = None


def take_request(store: ExperienceStore, scenario: str) -> QueuedInstruction | None:
    """The oldest instruction not yet taken for `scenario`, marked taken: each instruction is
    taken once, by one worker, however many take at the same moment."""

    def take(db: Database) -> QueuedInstruction | None:
        while True:
            row = db.execute(
                "SELECT seq, id, instruction, provenance FROM train_requests "
                "WHERE scenario = ? AND taken_at IS NULL ORDER BY seq LIMIT 1",
                [scenario],
            ).fetchone()
            if row is None:
                return None
            # A compare-and-set: another worker may have taken it since the read (on
            # PostgreSQL the read does not wait for it). Then it is gone: take the next.
            taken = db.execute(
                "UPDATE train_requests SET taken_at = ? WHERE seq = ? AND taken_at IS NULL",
                [time.time(), row[0]],
            ).rowcount
            if taken:
                provenance = {"id": str(row[1]), **json.loads(row[3])} if row[3] else None
                return QueuedInstruction(str(row[1]), str(row[2]), provenance)

    return store.write(take).result()


def take_instruction(store: ExperienceStore, scenario: str) -> str | None:
    """`take_request`'s text alone."""
    request = take_request(store, scenario)
    return request.text if request is not None else None


def save_counts(
    store: ExperienceStore, scenario: str, waiting: int, consumed: int, stale_skipped: int
) -> None:
    row = {
        "scenario": scenario,
        "waiting": waiting,
        "consumed": consumed,
        "stale_skipped": stale_skipped,
        "updated_at": time.time(),
    }
    store.write(lambda db: db.upsert("learning_status", row, key="scenario")).result()


def save_step(store: ExperienceStore, row: dict[str, Any]) -> None:
    """One learning step: scenario, recipe, started_at, finished_at, outcome, error,
    candidate_id, instruction, metric_calls."""
    store.write(lambda db: db.insert("learning_steps", row)).result()


def fingerprint(store: ExperienceStore, scenario: str) -> tuple[Any, ...]:
    """Changes whenever the scenario gets a record, a report or a candidate, and whenever a
    candidate is decided (its records may be free to learn from again: a rejected gate, one
    a recovery ended on another replica). Records commit in `seq` order across replicas
    (`Database.begin_write`), so their largest `seq` says it; reports and candidates need not,
    so a row count goes with theirs: one that commits late with a lower `seq` than a row
    already seen still changes it (rows are never deleted). And whenever a step spends
    records (`spend_records`): the next batch is then another."""
    open_states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    (row,) = store.query(
        "SELECT (SELECT MAX(seq) FROM records WHERE scenario = ?) AS records, "
        "(SELECT MAX(seq) FROM reports WHERE scenario = ?) AS reports, "
        "(SELECT COUNT(*) FROM reports WHERE scenario = ?) AS reports_n, "
        "(SELECT MAX(seq) FROM candidates WHERE scenario = ?) AS candidates, "
        "(SELECT COUNT(*) FROM candidates WHERE scenario = ?) AS candidates_n, "
        f"(SELECT COUNT(*) FROM candidates WHERE scenario = ? AND state IN ({open_states})) "
        "AS open_n, "
        "(SELECT COUNT(*) FROM candidates WHERE scenario = ? AND records_returned = 1) "
        "AS returned_n, "
        "(SELECT COUNT(*) FROM learning_spent WHERE scenario = ?) AS spent_n",
        [scenario] * 8,
    )
    names = ("records", "reports", "reports_n", "candidates", "candidates_n", "open_n")
    return tuple(row[name] for name in (*names, "returned_n", "spent_n"))


def learning_status(store: ExperienceStore) -> dict[str, Any]:
    """Per scenario: records waiting, consumed, stale skipped, batches built, the last step,
    per recipe (`recipes`) its step count, its metric calls in all and its last step (each
    step's `metric_calls`: the answers it asked for to score), and the worker that learns on it now
    (`learner`: host, pid and a random part)."""
    status: dict[str, Any] = {}
    for row in store.query("SELECT * FROM learning_status"):
        status[row["scenario"]] = {k: row[k] for k in ("waiting", "consumed", "stale_skipped")}
    for row in store.query(
        "SELECT scenario, COUNT(*) AS steps FROM learning_steps GROUP BY scenario"
    ):
        status.setdefault(row["scenario"], {})["batches_built"] = row["steps"]
    for row in _last_steps(store, "scenario"):
        status.setdefault(row["scenario"], {})["last_step"] = _step(row)
    for row in _last_steps(store, "scenario, recipe"):
        if row["recipe"]:
            recipes = status.setdefault(row["scenario"], {}).setdefault("recipes", {})
            recipes[row["recipe"]] = {
                "steps": row["steps"],
                "metric_calls": row["spent"],
                "last_step": _step(row),
            }
    for scenario, found in signal_yield(store).items():
        status.setdefault(scenario, {})["signal"] = found
    for name, lease in lease_holders(store).items():
        kind, _, scenario = name.partition(":")
        if kind == "learner":  # which worker learns on it, of all sharing the store
            status.setdefault(scenario, {})["learner"] = lease["holder"]
    return status


def _last_steps(store: ExperienceStore, group: str) -> list[dict[str, Any]]:
    """The newest step of each `group` (scenario, or scenario and recipe), with its candidate's
    metrics, the group's step count and its metric calls in all (`spent`)."""
    return store.query(
        "SELECT s.*, c.metrics, n.steps, n.spent FROM learning_steps s "
        "LEFT JOIN candidates c ON c.id = s.candidate_id "
        "JOIN (SELECT MAX(seq) AS seq, COUNT(*) AS steps, "
        f"COALESCE(SUM(metric_calls), 0) AS spent FROM learning_steps GROUP BY {group}) n "
        "ON n.seq = s.seq"
    )


def _step(row: dict[str, Any]) -> dict[str, Any]:
    metrics = json.loads(row["metrics"]) if row["metrics"] else {}
    return {
        "recipe": row["recipe"],
        "outcome": row["outcome"],
        "error": row["error"],
        # Why it ended so: a step that proposed nothing, or whose gate decided, says why.
        "detail": row["detail"],
        "candidate_id": row["candidate_id"],
        "finished_at": row["finished_at"],
        "metric_calls": row["metric_calls"] or 0,
        # A training recipe's loss per step, when its candidate recorded one.
        "loss": metrics.get("loss") if isinstance(metrics, dict) else None,
    }


def calls_fingerprint(store: ExperienceStore, scenario: str) -> tuple[Any, ...]:
    """Changes whenever the scenario gets a call, a report or a shadow answer, as `fingerprint`
    reasons (commit order by `seq`, and a count beside the reports' for one that commits late):
    what the live pass rates are kept by between two reads."""
    (row,) = store.query(
        "SELECT (SELECT MAX(seq) FROM records WHERE scenario = ?) AS records, "
        "(SELECT MAX(seq) FROM reports WHERE scenario = ?) AS reports, "
        "(SELECT COUNT(*) FROM reports WHERE scenario = ?) AS reports_n, "
        "(SELECT MAX(seq) FROM shadow_records WHERE scenario = ?) AS shadows",
        [scenario] * 4,
    )
    return (row["records"], row["reports"], row["reports_n"], row["shadows"])


# Reports by who wrote them: the scenario's teacher (its demonstrations, `server/teacher.py`),
# a batch imported from elsewhere (on records `POST /reef/records/batch` stored), or users.
TEACHER_REPORT = '%"source": "teacher"%'  # json.dumps of the teacher's metadata
IMPORTED_ENGINE = "import"  # reef.evaluation.live.IMPORTED
REPORTS_BY_SOURCE = (
    "SELECT scenario, COUNT(*) AS n, "
    "SUM(CASE WHEN metadata LIKE ? THEN 1 ELSE 0 END) AS teacher, "
    "SUM(CASE WHEN EXISTS (SELECT 1 FROM report_references rr JOIN records r "
    "ON r.id = rr.record_id WHERE rr.report_id = reports.id AND r.engine = ?) "
    "THEN 1 ELSE 0 END) AS imported "
    "FROM reports GROUP BY scenario"
)


def signal_yield(store: ExperienceStore) -> dict[str, dict[str, Any]]:
    """Per scenario, what became of the feedback: reports received (`reports_by_source`: users',
    the teacher's, imported), calls a candidate learned
    from (`learned_from`, summed over steps), calls held out for the gate now (the newest step's
    count), and calls dropped by reason over its steps: a call a step learned nothing from is
    counted once, for one reason, and set aside for that recipe (`spend_records`) until a new
    report on it makes it worth another try, when it may count again."""
    found: dict[str, dict[str, Any]] = {}
    for row in store.query(REPORTS_BY_SOURCE, [TEACHER_REPORT, IMPORTED_ENGINE]):
        by_source = {
            "user": row["n"] - row["teacher"] - row["imported"],
            "teacher": row["teacher"],
            "imported": row["imported"],
        }
        found[row["scenario"]] = {
            "reports": row["n"],
            "reports_by_source": by_source,
            "learned_from": 0,
            "dropped": {},
        }
    for row in store.query(
        "SELECT scenario, signal FROM learning_steps WHERE signal IS NOT NULL ORDER BY seq"
    ):
        signal = json.loads(row["signal"])
        totals = found.setdefault(
            row["scenario"],
            {"reports": 0, "reports_by_source": {}, "learned_from": 0, "dropped": {}},
        )
        totals["learned_from"] += int(signal.get("learned_from") or 0)
        totals["held_out"] = int(signal.get("held_out") or 0)
        for reason, count in (signal.get("dropped") or {}).items():
            totals["dropped"][reason] = totals["dropped"].get(reason, 0) + int(count)
    return found


def spend_records(
    store: ExperienceStore, scenario: str, recipe: str, record_ids: Iterable[str]
) -> None:
    """Set aside records a step of `recipe` tried and learned nothing from, with the reports
    each has now (`spent_record_ids`)."""
    ids = sorted(set(record_ids))
    if not ids:
        return
    marks = ", ".join("?" * len(ids))
    counts = {
        row["record_id"]: row["n"]
        for row in store.query(
            "SELECT record_id, COUNT(*) AS n FROM report_references "
            f"WHERE record_id IN ({marks}) GROUP BY record_id",
            ids,
        )
    }
    rows = [
        {
            "scenario": scenario,
            "recipe": recipe,
            "record_id": record_id,
            "reports": counts.get(record_id, 0),
            "created_at": time.time(),
        }
        for record_id in ids
    ]

    def spend(db: Database) -> None:
        for row in rows:
            db.upsert("learning_spent", row, "scenario, recipe, record_id")

    store.write(spend).result()


def spent_record_ids(store: ExperienceStore, scenario: str, recipe: str) -> set[str]:
    """The records `recipe` learned nothing from on `scenario` and that got no report since."""
    rows = store.query(
        "SELECT s.record_id FROM learning_spent s WHERE s.scenario = ? AND s.recipe = ? "
        "AND s.reports >= (SELECT COUNT(*) FROM report_references r "
        "WHERE r.record_id = s.record_id)",
        [scenario, recipe],
    )
    return {row["record_id"] for row in rows}


def save_annotation(
    store: ExperienceStore, scenario: str, source: str, record_id: str, data: dict[str, Any]
) -> None:
    """What recipe `source` concluded about a record (e.g. a judge's votes), kept beside it."""
    row = {
        "record_id": record_id,
        "scenario": scenario,
        "source": source,
        "created_at": time.time(),
        "data": json.dumps(data),
    }
    store.write(lambda db: db.insert("record_annotations", row)).result()


def with_annotations(store: ExperienceStore, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records, each with `annotations`: what recipes concluded about it, oldest first."""
    ids = [record["id"] for record in records]
    found: dict[str, list[dict[str, Any]]] = {record_id: [] for record_id in ids}
    for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for row in store.query(
            "SELECT record_id, source, created_at, data FROM record_annotations "
            f"WHERE record_id IN ({marks}) ORDER BY seq",
            chunk,
        ):
            data = json.loads(row["data"])
            found[row["record_id"]].append(
                {**data, "source": row["source"], "created_at": row["created_at"]}
            )
    return [{**record, "annotations": found[record["id"]]} for record in records]


def step_totals(store: ExperienceStore) -> list[dict[str, Any]]:
    """Learning steps by scenario, recipe and outcome: their count `n` and seconds `s`."""
    return store.query(
        "SELECT scenario, recipe, outcome, COUNT(*) AS n, "
        "SUM(finished_at - started_at) AS s FROM learning_steps "
        "GROUP BY scenario, recipe, outcome"
    )


def candidate_totals(store: ExperienceStore) -> list[dict[str, Any]]:
    """Candidates by scenario and state: their count `n` and seconds from proposal to their
    last move `s`."""
    return store.query(
        "SELECT scenario, state, COUNT(*) AS n, SUM(updated_at - created_at) AS s "
        "FROM candidates GROUP BY scenario, state"
    )


def newest_candidate_metrics(store: ExperienceStore) -> list[dict[str, Any]]:
    """The metrics (JSON text) of each recipe's newest candidate, by scenario and source."""
    return store.query(
        "SELECT c.scenario, c.source, c.metrics FROM candidates c "
        "JOIN (SELECT MAX(seq) AS seq FROM candidates GROUP BY scenario, source) n "
        "ON n.seq = c.seq"
    )


def learning_counts(store: ExperienceStore) -> list[dict[str, Any]]:
    """Each scenario's records waiting, consumed and left out as stale, as the worker last
    counted them."""
    return store.query("SELECT scenario, waiting, consumed, stale_skipped FROM learning_status")


def queue_instruction_once(
    store: ExperienceStore,
    request_id: str,
    scenario: str,
    text: str,
    provenance: dict[str, Any] | None = None,
) -> bool:
    """Queue an instruction under the caller's id, once (blocking): False when an identical
    one is queued under that id already, `Conflict` when another is. One write transaction,
    so two identical requests racing queue it once."""

    def queue(db: Database) -> bool:
        row = db.execute(
            "SELECT scenario, instruction FROM train_requests WHERE id = ?", [request_id]
        ).fetchone()
        if row is not None:
            if (row[0], row[1]) != (scenario, text):
                raise Conflict(
                    f"agent_record_id {request_id!r} was already used for another instruction: "
                    "send a new agent_record_id, or the same request to have it acknowledged",
                    code="agent_record_id_conflict",
                )
            return False
        db.insert("train_requests", _request_row(request_id, scenario, text, provenance))
        return True

    return bool(store.write(queue).result())
