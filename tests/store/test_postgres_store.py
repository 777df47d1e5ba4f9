"""What only the PostgreSQL store does: its migrations under concurrent openers, passwords kept
out of messages, commits never on the caller's thread, and `reef store migrate` moving a
project's experience from SQLite to PostgreSQL and back, on a real server."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli import app
from reef.store import ExperienceStore, Record, Report, learning
from reef.store.candidates import Candidate, CandidateStore
from reef.store.experience import StoreUnavailable
from reef.store.migrations import MIGRATIONS
from reef.testing.processes import free_port


def served(store: ExperienceStore, text: str) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"{text}!"}}]},
        engine="test",
        release_id="base",
        completion_token_ids=[1, 2],
    )
    return store.add_record(record).result()


def test_two_processes_opening_a_new_database_at_once_migrate_it_once(postgres_url: str) -> None:
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: ExperienceStore(postgres_url), range(4)))
    try:
        names = [row["name"] for row in stores[0].query("SELECT name FROM _reef_migrations")]
        assert sorted(names) == sorted(name for name, _ in MIGRATIONS)
    finally:
        for store in stores:
            store.close()


def test_a_password_in_the_url_never_appears_in_a_message(postgres_url: str) -> None:
    unreachable = f"postgresql://reef:s3cret-pw@127.0.0.1:{free_port()}/reef"
    with pytest.raises(StoreUnavailable) as refused:
        ExperienceStore(unreachable, busy_timeout_s=1)
    assert (
        "s3cret-pw" not in refused.value.message and "reef:***@127.0.0.1" in refused.value.message
    )
    assert "PGPASSWORD" in refused.value.message  # what to do about it
    # The test server trusts every login: a password in the URL is accepted and never shown.
    with_password = postgres_url.replace("postgres@", "postgres:s3cret-pw@")
    with ExperienceStore(with_password) as store:
        assert "s3cret-pw" not in store.name and "s3cret-pw" not in str(store.stats())


def test_a_record_alone_is_committed_by_the_writer_never_on_the_callers_thread(
    postgres_url: str,
) -> None:
    """On SQLite an idle writer lets a lone caller commit on its own thread; on PostgreSQL a
    commit is a round trip, which must not block the caller (the server's event loop)."""
    built: list[str] = []

    def build() -> Record:
        built.append(threading.current_thread().name)
        return Record("default", {"messages": []}, {"choices": []}, "test", "base")

    with ExperienceStore(postgres_url) as store:
        record_id = store.add_record(build, alone=True).result(10)
        assert built == ["reef-store-writer"] and store.record_exists(record_id)


def a_project_with_experience(folder: Path) -> tuple[Path, dict]:
    """A SQLite project with records, a report, a candidate, steps and annotations; what a
    reader sees of them."""
    (folder / "reef.yaml").write_text("state_dir: .reef\n")
    with ExperienceStore(folder / ".reef/experience.db") as store:
        ids = [served(store, text) for text in ("one", "two", "three")]
        store.add_report(Report("default", [ids[2], ids[0]], score=0.0, feedback="no")).result()
        made = Candidate("default", "lora", "/tmp/c", "base", consumed_record_ids=ids[:2])
        CandidateStore(store).add(made)
        learning.save_step(store, {"scenario": "default", "started_at": 1.0, "outcome": "idle"})
        learning.save_counts(store, "default", waiting=1, consumed=2, stale_skipped=0)
        learning.save_annotation(store, "default", "openclaw_rl", ids[1], {"votes": [1]})
        return folder / "reef.yaml", seen(store)


def seen(store: ExperienceStore) -> dict:
    records = store.list_records(limit=100)
    return {
        "records": records,
        "annotations": learning.with_annotations(store, records),
        "candidates": [c.to_json() for c in CandidateStore(store).list()],
        "learning": learning.learning_status(store),
    }


def test_reef_store_migrate_moves_a_projects_experience_to_postgresql_and_back(
    tmp_path: Path, postgres_url: str
) -> None:
    config, before = a_project_with_experience(tmp_path)
    runner = CliRunner()
    moved = runner.invoke(app, ["store", "migrate", "--to", postgres_url, "-c", str(config)])
    assert moved.exit_code == 0, moved.output
    assert "Copied 12 rows" in moved.output
    with ExperienceStore(postgres_url) as store:
        assert seen(store) == before
        later = served(store, "four")  # numbers on after the copied rows
        assert store.list_records(limit=100)[-1]["id"] == later
    again = runner.invoke(app, ["store", "migrate", "--to", postgres_url, "-c", str(config)])
    assert again.exit_code == 1 and "already holds experience (4 records" in again.output
    # And back, with the project now on PostgreSQL (REEF_STORE_URL), to a new SQLite file.
    back = tmp_path / "back.db"
    env = {"REEF_STORE_URL": postgres_url}
    returned = runner.invoke(
        app, ["store", "migrate", "--to", str(back), "-c", str(config)], env=env
    )
    assert returned.exit_code == 0, returned.output
    with ExperienceStore(back) as store:
        assert seen(store)["records"][:3] == before["records"]
    info = runner.invoke(app, ["store", "info", "-c", str(config)], env=env)
    assert info.exit_code == 0 and "postgresql" in info.output and "records" in info.output
