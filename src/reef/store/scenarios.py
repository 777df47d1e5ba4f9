"""Scenarios a server learns of while it runs, in the store (`runtime_scenarios`): those created
over HTTP, the release each was created from, and the training mode selected for one. Every
replica, the learning worker and a restarted server read the same rows."""

from __future__ import annotations

from dataclasses import dataclass

from reef.store.database import Database
from reef.store.experience import ExperienceStore


@dataclass(frozen=True)
class RuntimeScenario:
    name: str
    training_mode: str | None  # selected at runtime; None: the configured one
    start_release_id: str | None  # the release it was created from, if one was named


def runtime_scenarios(store: ExperienceStore) -> dict[str, RuntimeScenario]:
    rows = store.query("SELECT name, training_mode, start_release_id FROM runtime_scenarios")
    return {
        row["name"]: RuntimeScenario(row["name"], row["training_mode"], row["start_release_id"])
        for row in rows
    }


def create_scenario(store: ExperienceStore, name: str, start_release_id: str | None = None) -> bool:
    """Record `name` as created (with the release it starts from); False if it was already."""

    def create(db: Database) -> bool:
        inserted = db.execute(
            "INSERT INTO runtime_scenarios (name, start_release_id, created_at) "
            f"VALUES (?, ?, {db.sql_now()}) ON CONFLICT (name) DO NOTHING",
            [name, start_release_id],
        ).rowcount
        return bool(inserted)

    return store.write(create).result()


def select_training_mode(store: ExperienceStore, name: str, mode: str) -> None:
    store.write(
        lambda db: db.execute(
            "INSERT INTO runtime_scenarios (name, training_mode, created_at) "
            f"VALUES (?, ?, {db.sql_now()}) "
            "ON CONFLICT (name) DO UPDATE SET training_mode = excluded.training_mode",
            [name, mode],
        )
    ).result()


def selected_training_mode(store: ExperienceStore, name: str) -> str | None:
    rows = store.query("SELECT training_mode FROM runtime_scenarios WHERE name = ?", [name])
    return rows[0]["training_mode"] if rows else None
