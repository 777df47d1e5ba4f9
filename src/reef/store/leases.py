"""Leases: exactly one process at a time does a job, across every replica sharing the store.

A lease has a name (`learner:support`), a holder (a process anywhere: host, pid and a random
part) and an expiry on the database's clock, so that replicas' clocks need not agree. A holder
renews it well before it expires; one that stops (killed, partitioned from the database) loses it
at expiry, and the next process to ask takes it over. On SQLite every process is on one machine;
on PostgreSQL they may be anywhere.
"""

from __future__ import annotations

import os
import secrets
import socket

from reef.store.database import Database
from reef.store.experience import ExperienceStore


def new_holder() -> str:
    """This process, as a lease holder: `host:pid:random` (a pid is reused; the random part is
    not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def take_lease(store: ExperienceStore, name: str, holder: str, period_s: float) -> bool:
    """Take the lease `name` for `period_s` seconds, or renew it if `holder` has it already;
    whether `holder` holds it now (False: another holder's lease has not expired)."""

    def take(db: Database) -> bool:
        now = db.sql_now()
        db.execute(
            "INSERT INTO leases (name, holder, expires_at) "
            f"VALUES (:name, :holder, {now} + :period) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
            "expires_at = excluded.expires_at "
            f"WHERE leases.holder = excluded.holder OR leases.expires_at < {now}",
            {"name": name, "holder": holder, "period": period_s},
        )
        row = db.execute("SELECT holder FROM leases WHERE name = ?", [name]).fetchone()
        return row is not None and row[0] == holder

    return store.write(take).result()


def give_up_lease(store: ExperienceStore, name: str, holder: str) -> None:
    """Let the lease go at once (a clean stop), if `holder` has it: the next asker takes it."""
    store.write(
        lambda db: db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", [name, holder])
    ).result()


def lease_holders(store: ExperienceStore) -> dict[str, dict[str, float | str]]:
    """Every lease not yet expired: its holder, and the seconds it has left."""
    rows = store.query(
        f"SELECT name, holder, expires_at - {store.sql_now()} AS left_s FROM leases "
        f"WHERE expires_at >= {store.sql_now()}"
    )
    return {row["name"]: {"holder": row["holder"], "left_s": row["left_s"]} for row in rows}
