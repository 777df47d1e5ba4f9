"""A real, throwaway PostgreSQL server for tests: its own cluster in a temporary directory.

`PostgresServer` runs initdb and pg_ctl from the machine's PostgreSQL (found on PATH or in
Debian's /usr/lib/postgresql/N/bin), listens on a free port on 127.0.0.1 with trust
authentication for the `postgres` superuser, and hands out fresh empty databases by URL:

    with PostgresServer() as server:
        url = server.create_database()  # postgresql://postgres@127.0.0.1:PORT/test_1

The server keeps PostgreSQL's durable defaults (fsync and synchronous_commit on), so a commit
a test sees has reached the disk. PostgreSQL refuses to run as root; as root the cluster belongs
to the `postgres` system user, and initdb and pg_ctl run as that user (runuser). Nothing here
touches the machine's own clusters.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

from reef.testing.processes import free_port

START_TIMEOUT = 30  # seconds
SERVER_USER = "postgres"  # the system user that runs the server when we are root


def find_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: PATH's first, else the newest Debian one."""
    candidates: list[Path] = []
    for name in ("pg_ctl", "initdb"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(os.path.realpath(found)).parent)
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    debian.sort(key=lambda path: _version(Path(path).parent.name), reverse=True)
    candidates += [Path(path) for path in debian]
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _version(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return ()


def _as_root() -> bool:
    return os.geteuid() == 0


def postgres_available() -> str | None:
    """None if `PostgresServer` can run here, else a sentence saying why it cannot."""
    if find_bin_dir() is None:
        return (
            "PostgreSQL is not installed: no initdb and pg_ctl on PATH or in "
            "/usr/lib/postgresql/*/bin (apt-get install postgresql)"
        )
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    if _as_root():
        if shutil.which("runuser") is None:
            return "running as root, PostgreSQL must run as another user, and runuser is missing"
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (
                "running as root, PostgreSQL must run as another user, "
                f"and there is no {SERVER_USER!r} user"
            )
    return None


class PostgresServer:
    """One PostgreSQL cluster of its own in a temporary directory, on 127.0.0.1:`port`."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.port = 0
        self._bin_dir: Path | None = None
        self._created = itertools.count(1)
        self._started = False

    @property
    def data_dir(self) -> Path:
        return self._dir() / "data"

    @property
    def log_path(self) -> Path:
        return self._dir() / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def start(self) -> PostgresServer:
        """Make a fresh cluster and start it; ready for connections when this returns."""
        if self.directory is not None:
            raise RuntimeError("this PostgreSQL server was already started")
        self._bin_dir = find_bin_dir()
        if self._bin_dir is None:
            raise RuntimeError(postgres_available() or "PostgreSQL is not installed")
        self.directory = Path(tempfile.mkdtemp(prefix="reef-postgres-"))
        try:
            if _as_root():
                user = pwd.getpwnam(SERVER_USER)
                os.chown(self.directory, user.pw_uid, user.pw_gid)
            # --no-sync skips only initdb's own flush of the new files (a throwaway cluster
            # need not survive a power cut); the running server syncs every commit as usual.
            # Locale C: UTF8 text, compared byte by byte, as SQLite compares it.
            self._run(
                "initdb",
                "-D", str(self.data_dir),
                "-U", "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )  # fmt: skip
            self.port = free_port()
            with (self.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(
                    "\n# reef.testing.postgres: a throwaway server for tests\n"
                    f"port = {self.port}\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.directory}'\n"
                )
            self._start_server()
            self._started = True
        except BaseException:
            self.stop()
            raise
        return self

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database (named `test_N` unless `name` is given); returns its URL."""
        import psycopg
        from psycopg import sql

        if not self._started:
            raise RuntimeError("start the PostgreSQL server before creating databases")
        name = name or f"test_{next(self._created)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown: connections are closed) and remove its directory."""
        if self.directory is None:
            return
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w")
            except RuntimeError:
                # Already gone (a test killed it), or stuck: make sure nothing is left running.
                self._run_quietly("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None
        self._started = False

    def pause(self) -> None:
        """Stop the server, keeping its data: its clients lose their connections, as when a
        database server goes down."""
        self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w")

    def crash(self) -> None:
        """Stop the server as a crash does (`pg_ctl stop -m immediate`: its processes quit at
        once, nothing is flushed), keeping its data: `resume` then recovers from the WAL."""
        self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate", "-w")

    def resume(self) -> None:
        """Start the paused or crashed server again, on the same port, with the same data."""
        self._start_server()

    def _start_server(self) -> None:
        """pg_ctl start, waiting until the server accepts connections."""
        self._run(
            "pg_ctl", "start",
            "-D", str(self.data_dir),
            "-l", str(self.log_path),
            "-w", "-t", str(START_TIMEOUT),
            timeout=START_TIMEOUT + 10,
            log_tail=True,
        )  # fmt: skip

    def log(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log."""
        if self.directory is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> PostgresServer:
        if self.directory is None:  # `with server.start():` has started it already
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _dir(self) -> Path:
        if self.directory is None:
            raise RuntimeError("this PostgreSQL server is not started")
        return self.directory

    def _command(self, program: str, *args: str) -> list[str]:
        assert self._bin_dir is not None, "start() finds the binaries"
        command = [str(self._bin_dir / program), *args]
        return ["runuser", "-u", SERVER_USER, "--", *command] if _as_root() else command

    def _run(self, program: str, *args: str, timeout: float = 60, log_tail: bool = False) -> None:
        command = self._command(program, *args)
        try:
            done = subprocess.run(
                command, cwd=self.directory, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as error:
            output, failure = str(error.output or ""), f"did not finish in {timeout}s"
        else:
            if done.returncode == 0:
                return
            output, failure = done.stdout + done.stderr, f"exited with {done.returncode}"
        message = f"{' '.join(command)} {failure}:\n{output.strip()}"
        if log_tail:
            message += f"\n--- server log ({self.log_path}), last lines ---\n{self.log()}"
        raise RuntimeError(message)

    def _run_quietly(self, program: str, *args: str) -> None:
        subprocess.run(
            self._command(program, *args), cwd=self.directory, capture_output=True, timeout=60
        )
