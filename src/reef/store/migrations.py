"""Named, append-only schema migrations for the experience store.

Never edit a migration that has shipped: add a new one at the bottom. Each runs once, in order,
inside one transaction together with the row that records its name in `_reef_migrations`, so a
crash mid-migration leaves the database as it was before it.

Migrations are written in SQLite's words, in the SQL both databases share; PostgreSQL reads them
with its own types (`Database.schema`). A migration that needs other words in one database has
them in `DIALECT_SQL`.
"""

from __future__ import annotations

import time

from reef.store.database import Database

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_records_and_reports",
        """
        CREATE TABLE records (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scenario TEXT NOT NULL,
            session TEXT,
            created_at REAL NOT NULL,
            request TEXT NOT NULL,
            response TEXT NOT NULL,
            engine TEXT NOT NULL,
            model TEXT,
            release_id TEXT NOT NULL,
            stream INTEGER NOT NULL DEFAULT 0,
            completion_token_ids TEXT,
            completion_logprobs TEXT,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            usage TEXT,
            latency_ms REAL,
            ttft_ms REAL,
            content_hash TEXT NOT NULL
        );
        CREATE INDEX records_scenario_seq ON records (scenario, seq);
        CREATE INDEX records_session ON records (session);
        CREATE INDEX records_content_hash ON records (content_hash);

        CREATE TABLE reports (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scenario TEXT NOT NULL,
            created_at REAL NOT NULL,
            score REAL,
            feedback TEXT,
            metadata TEXT,
            content_hash TEXT NOT NULL
        );
        CREATE INDEX reports_scenario_seq ON reports (scenario, seq);

        CREATE TABLE report_references (
            report_id TEXT NOT NULL REFERENCES reports (id),
            record_id TEXT NOT NULL REFERENCES records (id),
            PRIMARY KEY (report_id, record_id)
        );
        CREATE INDEX report_references_record ON report_references (record_id);
        """,
    ),
    (
        "0002_candidates",
        """
        CREATE TABLE candidates (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scenario TEXT NOT NULL,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            base_release_id TEXT,
            source TEXT,
            reason TEXT,
            decision TEXT,
            evaluation TEXT,
            release_id TEXT,
            files_path TEXT NOT NULL,
            consumed_record_ids TEXT
        );
        CREATE INDEX candidates_scenario_state ON candidates (scenario, state);
        """,
    ),
    (
        "0003_learning",
        """
        CREATE TABLE candidate_records (
            candidate_id TEXT NOT NULL REFERENCES candidates (id),
            record_id TEXT NOT NULL REFERENCES records (id),
            PRIMARY KEY (candidate_id, record_id)
        );
        CREATE INDEX candidate_records_record ON candidate_records (record_id);

        CREATE TABLE learning_steps (
            seq INTEGER PRIMARY KEY,
            scenario TEXT NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL,
            outcome TEXT,
            error TEXT,
            candidate_id TEXT,
            batch_size INTEGER,
            instruction TEXT
        );
        CREATE INDEX learning_steps_scenario ON learning_steps (scenario, seq);

        CREATE TABLE learning_status (
            scenario TEXT PRIMARY KEY,
            waiting INTEGER NOT NULL DEFAULT 0,
            consumed INTEGER NOT NULL DEFAULT 0,
            stale_skipped INTEGER NOT NULL DEFAULT 0,
            updated_at REAL
        );

        CREATE TABLE train_requests (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scenario TEXT NOT NULL,
            instruction TEXT NOT NULL,
            created_at REAL NOT NULL,
            taken_at REAL
        );
        """,
    ),
    (
        "0004_candidates_evaluating_pid",
        # Which process is evaluating a candidate, so that start-up ends only evaluations whose
        # process is gone, never one that a `reef release publish` is running right now.
        """
        ALTER TABLE candidates ADD COLUMN evaluating_pid INTEGER;
        """,
    ),
    (
        "0005_records_prompt_token_ids",
        # The prompt as the model read it (harness applied, chat template rendered), so training
        # learns from exactly what was served and its importance ratios match the logprobs.
        """
        ALTER TABLE records ADD COLUMN prompt_token_ids TEXT;
        """,
    ),
    (
        "0006_candidates_metrics",
        # What a recipe measured while building a candidate: a training run's loss per step.
        """
        ALTER TABLE candidates ADD COLUMN metrics TEXT;
        """,
    ),
    (
        "0007_record_annotations",
        # What a recipe concluded about a record while learning from it (a judge's votes and
        # hint), kept beside the record so that `reef records` can show why it was trained so.
        """
        CREATE TABLE record_annotations (
            seq INTEGER PRIMARY KEY,
            record_id TEXT NOT NULL REFERENCES records (id),
            scenario TEXT NOT NULL,
            source TEXT NOT NULL,
            created_at REAL NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX record_annotations_record ON record_annotations (record_id);
        """,
    ),
    (
        "0008_candidates_unjudged_records_returned",
        # A candidate the gate never judged on its merits (the engine was unavailable, a shutdown
        # cancelled it, publishing failed, the head moved) is `unjudged` and gives its records
        # back to learning: its feedback was never tried, so it must not be lost.
        """
        ALTER TABLE candidates ADD COLUMN unjudged INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE candidates ADD COLUMN records_returned INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        "0009_learning_steps_recipe",
        # A scenario may learn with several recipes: each step says whose it was.
        """
        ALTER TABLE learning_steps ADD COLUMN recipe TEXT;
        """,
    ),
    (
        "0010_records_sampling",
        # The settings each answer was sampled with (defaults included): the behaviour policy
        # that training corrects for.
        """
        ALTER TABLE records ADD COLUMN sampling TEXT;
        """,
    ),
    (
        "0011_report_references_position",
        # A report's references in the order it gave them, in any database (SQLite's rowid
        # kept that order; PostgreSQL has none).
        """
        ALTER TABLE report_references ADD COLUMN position INTEGER;
        UPDATE report_references SET position = rowid;
        """,
    ),
    (
        "0012_leases",
        # Who does a job that exactly one process may do at a time, across replicas (the
        # learner of a scenario), until when: a holder that stops renewing loses it at expiry.
        """
        CREATE TABLE leases (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires_at REAL NOT NULL
        );
        """,
    ),
    (
        "0013_candidates_evaluating_host",
        # The host of the process evaluating a candidate: a pid means something only there, so
        # a replica on another machine never takes a running evaluation for an interrupted one.
        """
        ALTER TABLE candidates ADD COLUMN evaluating_host TEXT;
        """,
    ),
    (
        "0014_records_arm",
        # A call served under a routing policy (a canary): the release whose policy routed it
        # and the arm it took, so that each arm's reports can be compared over the same period.
        """
        ALTER TABLE records ADD COLUMN routing_release_id TEXT;
        ALTER TABLE records ADD COLUMN arm TEXT;
        CREATE INDEX records_routing ON records (routing_release_id);
        """,
    ),
    (
        "0015_shadow_records",
        # A shadow candidate's answers to copies of live calls: never returned to anyone, kept
        # beside the live record they copy, each side scored when the scenario has a scorer.
        """
        CREATE TABLE shadow_records (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            scenario TEXT NOT NULL,
            candidate_id TEXT NOT NULL,
            live_record_id TEXT NOT NULL REFERENCES records (id),
            created_at REAL NOT NULL,
            response TEXT NOT NULL,
            latency_ms REAL,
            completion_tokens INTEGER,
            live_score REAL,
            shadow_score REAL
        );
        CREATE INDEX shadow_records_candidate ON shadow_records (candidate_id, seq);
        """,
    ),
    (
        "0016_records_failed_arm",
        # A call the teacher took over because the student's answer failed its check: the arm
        # that answer came from, which a canary counts as that arm's failure.
        """
        ALTER TABLE records ADD COLUMN failed_arm TEXT;
        """,
    ),
    (
        "0017_record_tags",
        # What a client said about a call in `x-reef-tag-<name>` headers, to find its records
        # by (`GET /reef/records?tag=name:value`).
        """
        CREATE TABLE record_tags (
            record_id TEXT NOT NULL,
            name TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (record_id, name)
        );
        CREATE INDEX record_tags_by_value ON record_tags (name, value, record_id);
        """,
    ),
    (
        "0018_lease_generation_and_evaluation_heartbeat",
        # A lease's generation, bumped each time a new holder takes it: a publish carries the
        # generation it was started under and is refused once another holder took the lease.
        # An evaluation's heartbeat (the database's clock), renewed by the process gating it: a
        # candidate whose heartbeat stopped is recoverable by any replica, whatever its host.
        """
        ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE candidates ADD COLUMN evaluation_heartbeat_at REAL;
        """,
    ),
    (
        "0019_runtime_scenarios",
        # Scenarios created over HTTP (`POST /reef/scenarios`, an `x-reef-release-id` binding a
        # new one) and the training mode selected for one (`POST /reef/scenarios/{s}/update`):
        # in the store, so every replica and the learning worker see them, and a restart keeps
        # them. `start_release_id`: the release a scenario was created from, if one was named.
        """
        CREATE TABLE runtime_scenarios (
            name TEXT PRIMARY KEY,
            training_mode TEXT,
            start_release_id TEXT,
            created_at REAL NOT NULL
        );
        """,
    ),
    (
        "0020_train_request_provenance",
        # Where an instruction came from (`POST /reef/train`'s session, release_id and requires,
        # as JSON): the candidate it leads to carries it in its metrics, `training_request`.
        """
        ALTER TABLE train_requests ADD COLUMN provenance TEXT;
        """,
    ),
    (
        "0021_learning_steps_metric_calls",
        # The answers a step asked the served model for to score them (its recipe's search and
        # its gate's evaluation): the budget recipes are compared on.
        """
        ALTER TABLE learning_steps ADD COLUMN metric_calls INTEGER;
        """,
    ),
    (
        "0022_learning_steps_detail_signal",
        # Why a step ended as it did (a step that proposed nothing says why), and what became of
        # its signal (learned from, held out, dropped by reason), as JSON.
        """
        ALTER TABLE learning_steps ADD COLUMN detail TEXT;
        ALTER TABLE learning_steps ADD COLUMN signal TEXT;
        """,
    ),
    (
        "0023_learning_spent",
        # Records a recipe's step tried and learned nothing from (each of its turns dropped, for
        # a reason the step counted), with the reports they had then: the recipe's next steps
        # move past them instead of trying the oldest failing turns again for ever, until a new
        # report on one makes it worth another try.
        """
        CREATE TABLE learning_spent (
            scenario TEXT NOT NULL,
            recipe TEXT NOT NULL,
            record_id TEXT NOT NULL,
            reports INTEGER NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (scenario, recipe, record_id)
        );
        """,
    ),
    (
        "0024_records_search",
        # Full-text search over what was asked and answered (`reef records --search`): on
        # SQLite a contentless FTS5 index of the records' columns (the words' index only, the
        # text stays in `records`), on PostgreSQL a table of each record's words with a GIN
        # index (DIALECT_SQL). Neither is written when a
        # call is stored: a search first indexes the records stored since the last one
        # (`Database.sql_index_records`), so serving pays nothing for it.
        """
        CREATE VIRTUAL TABLE records_search USING fts5(request, response, content='');
        """,
    ),
]

# (migration, dialect) -> that migration in the dialect's words.
DIALECT_SQL: dict[tuple[str, str], str] = {
    ("0024_records_search", "postgresql"): (
        "CREATE TABLE records_search (seq BIGINT PRIMARY KEY, words TSVECTOR NOT NULL);"
        "CREATE INDEX records_search_words ON records_search USING GIN (words)"
    ),
    # A new PostgreSQL database has no references to number.
    ("0011_report_references_position", "postgresql"): (
        "ALTER TABLE report_references ADD COLUMN position INTEGER"
    ),
}


def apply_migrations(db: Database) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now.

    The connection must be in autocommit mode so that the explicit transactions here are the
    only transaction boundaries.
    """
    with db.migrating():
        done_table = "_reef_migrations (name TEXT PRIMARY KEY, applied_at REAL)"
        db.execute(db.schema(f"CREATE TABLE IF NOT EXISTS {done_table}"))
        done = {row[0] for row in db.execute("SELECT name FROM _reef_migrations").fetchall()}
        return [name for name, sql in MIGRATIONS if name not in done and _apply(db, name, sql)]


def _apply(db: Database, name: str, sql: str) -> bool:
    """Apply one migration in a transaction of its own; False if another process just did."""
    db.begin_write()
    try:
        # A second process may have applied it while we waited for the write lock.
        if db.execute("SELECT 1 FROM _reef_migrations WHERE name = ?", [name]).fetchone():
            db.execute("ROLLBACK")
            return False
        for statement in _statements(DIALECT_SQL.get((name, db.dialect)) or db.schema(sql)):
            db.execute(statement)
        db.execute("INSERT INTO _reef_migrations VALUES (?, ?)", [name, time.time()])
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return True


def _statements(sql: str) -> list[str]:
    return [part.strip() for part in sql.split(";") if part.strip()]
