"""The throwaway PostgreSQL server the PostgreSQL store's tests run against (`postgres` fixture)."""

from __future__ import annotations

import psycopg

from reef.testing.postgres import PostgresServer


def test_each_database_is_fresh_and_apart(postgres: PostgresServer) -> None:
    first, second = postgres.create_database(), postgres.create_database()
    assert first != second
    with psycopg.connect(first) as connection:
        connection.execute("CREATE TABLE only_here (n INTEGER)")
        connection.execute("INSERT INTO only_here VALUES (1)")
    with psycopg.connect(first) as connection:  # committed: a new connection sees it
        assert connection.execute("SELECT n FROM only_here").fetchall() == [(1,)]
    with psycopg.connect(second) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == []


def test_a_commit_reaches_the_disk(postgres_url: str) -> None:
    """The store's durability tests count on a commit being on disk when it returns."""
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SELECT current_user").fetchone() == ("postgres",)
        assert connection.execute("SHOW fsync").fetchone() == ("on",)
        assert connection.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert connection.execute("SHOW server_encoding").fetchone() == ("UTF8",)


def test_a_named_database_has_its_name(postgres: PostgresServer) -> None:
    url = postgres.create_database("named here")
    assert url == f"postgresql://postgres@127.0.0.1:{postgres.port}/named%20here"
    with psycopg.connect(url) as connection:
        assert connection.execute("SELECT current_database()").fetchone() == ("named here",)
