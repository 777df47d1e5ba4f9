"""Leases: exactly one process at a time does a job, across every replica sharing the store.

A lease has a name (`learner:support`), a holder (a process anywhere: host, pid and a random
part) and an expiry on the database's clock, so that replicas' clocks need not agree. A holder
renews it well before it expires; one that stops (killed, partitioned from the database) loses it
at expiry, and the next process to ask takes it over. On SQLite every process is on one machine;
on PostgreSQL they may be anywhere.

A lease is also a fence. Each time a new holder takes it its `generation` goes up (it never goes
down: a lease given up keeps its row and generation). A job that must not outlive its leadership
(a publish) remembers the generation it started under and, right before the step others would see
(moving a release head), calls `confirm_lease`: one compare-and-set on the lease row that passes
only while the holder and the generation are unchanged, and extends the lease by a period, so
that no other process can take it while that step runs. A holder whose lease another took is
told `LeaseLost` and does nothing.
"""

from __future__ import annotations

import os
import secrets
import socket

from reef.errors import Conflict
from reef.store.database import Database
from reef.store.experience import ExperienceStore


def new_holder() -> str:
    """This process, as a lease holder: `host:pid:random` (a pid is reused; the random part is
    not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class LeaseLost(Conflict):
    """Another holder took the lease since the job started: the job must not go on."""

    code = "lease_lost"


def take_lease(store: ExperienceStore, name: str, holder: str, period_s: float) -> int:
    """Take the lease `name` for `period_s` seconds, or renew it if `holder` has it already.
    The lease's generation while `holder` holds it now (a whole number from 1, bumped when a new
    holder takes it); 0 when another holder's lease has not expired."""

    def take(db: Database) -> int:
        now = db.sql_now()
        db.execute(
            "INSERT INTO leases (name, holder, expires_at, generation) "
            f"VALUES (:name, :holder, {now} + :period, 1) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
            "expires_at = excluded.expires_at, generation = CASE "
            "WHEN leases.holder = excluded.holder THEN leases.generation "
            "ELSE leases.generation + 1 END "
            f"WHERE leases.holder = excluded.holder OR leases.expires_at < {now}",
            {"name": name, "holder": holder, "period": period_s},
        )
        row = db.execute("SELECT holder, generation FROM leases WHERE name = ?", [name]).fetchone()
        return int(row[1]) if row is not None and row[0] == holder else 0

    return int(store.write(take).result())


def confirm_lease(
    store: ExperienceStore, name: str, holder: str, generation: int, period_s: float
) -> None:
    """The fence: pass only if `holder` still holds `name` in `generation` (nobody took it
    since, even if it expired), extending it `period_s` seconds from now, in one
    compare-and-set; `LeaseLost` otherwise."""

    def confirm(db: Database) -> int:
        return int(
            db.execute(
                f"UPDATE leases SET expires_at = {db.sql_now()} + :period "
                "WHERE name = :name AND holder = :holder AND generation = :generation",
                {"name": name, "holder": holder, "generation": generation, "period": period_s},
            ).rowcount
        )

    if not store.write(confirm).result():
        raise LeaseLost(
            f"the lease {name} is no longer held by {holder} in generation {generation}: "
            "another process took it over, so this one does not publish"
        )


def give_up_lease(store: ExperienceStore, name: str, holder: str) -> None:
    """Let the lease go at once (a clean stop), if `holder` has it: the next asker takes it.
    The row stays, expired and without a holder, so its generation goes on rising."""
    store.write(
        lambda db: db.execute(
            f"UPDATE leases SET holder = '', expires_at = {db.sql_now()} - 1 "
            "WHERE name = ? AND holder = ?",
            [name, holder],
        )
    ).result()


def lease_holders(store: ExperienceStore) -> dict[str, dict[str, float | str]]:
    """Every lease not yet expired: its holder, and the seconds it has left."""
    rows = store.query(
        f"SELECT name, holder, expires_at - {store.sql_now()} AS left_s FROM leases "
        f"WHERE expires_at >= {store.sql_now()}"
    )
    return {row["name"]: {"holder": row["holder"], "left_s": row["left_s"]} for row in rows}
