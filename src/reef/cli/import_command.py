"""`reef import FILE`: records made elsewhere, from a JSONL file into a running server.

Each line is a record envelope (`{"agent_record_id", "request_type", "payload", ...}`: see
`POST /reef/records/batch` in docs/http-api.md), sent in batches. After each batch the server has
acknowledged, the place reached in the file is saved beside it (`FILE.reef-import.json`), so a
rerun after an interruption (Ctrl-C, a kill, a lost connection) starts from there. The checkpoint
is an economy, not what prevents duplicates: the server stores each id once, so a batch resent
(its answer was lost, the file changed, `--restart`) is acknowledged again and not stored twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)

from reef.cli.client_commands import UrlOption, server_url
from reef.cli.output import console, fail
from reef.client import ReefClient, ReefClientError
from reef.urls import without_password

BATCH_PATH = "/reef/records/batch"
# The server takes at most 1000 records and 10 MiB (or server.max_body_bytes) in one batch.
MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 10 * 1024 * 1024 - 1
RETRIED = (408, 429, 500, 502, 503, 504)
RETRIES = 4


@dataclass
class Checkpoint:
    """Where an import of one file into one server's scenario has got to."""

    path: Path
    identity: dict[str, Any]
    offset: int = 0  # bytes of the file acknowledged
    line: int = 0  # lines of the file acknowledged
    records: int = 0  # records acknowledged

    def save(self) -> None:
        """Replace the checkpoint whole: a crash leaves the old one or the new one."""
        state = {**self.identity, "offset": self.offset, "line": self.line, "records": self.records}
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            with temporary.open("w") as out:
                json.dump(state, out)
                out.flush()
                os.fsync(out.fileno())
            temporary.replace(self.path)
        except OSError as error:
            fail(
                f"cannot write the checkpoint {escape(str(self.path))} ({error}): import a copy "
                "of the file from a folder you can write to"
            )


def _identity(source: Path, url: str, scenario: str) -> dict[str, Any]:
    digest = hashlib.sha256()
    with source.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return {
        "version": 1,
        "sha256": digest.hexdigest(),
        "size": source.stat().st_size,
        "url": without_password(url.rstrip("/")),
        "scenario": scenario,
    }


def _checkpoint(source: Path, identity: dict[str, Any], restart: bool) -> Checkpoint:
    path = source.with_name(source.name + ".reef-import.json")
    fresh = Checkpoint(path, identity)
    if restart or not path.exists():
        return fresh
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        console.print(f"[yellow]{escape(str(path))} is unreadable:[/] importing from the start")
        return fresh
    if not isinstance(state, dict) or any(state.get(k) != v for k, v in identity.items()):
        console.print(
            f"[yellow]{escape(str(path))} is of another file, server or scenario:[/] importing "
            "from the start (records the server has are acknowledged again, not stored twice)",
            highlight=False,
            soft_wrap=True,
        )
        return fresh
    offset, line, records = (state.get(name) for name in ("offset", "line", "records"))
    if not all(isinstance(n, int) and n >= 0 for n in (offset, line, records)):
        return fresh
    assert isinstance(offset, int) and isinstance(line, int) and isinstance(records, int)
    if offset > identity["size"]:
        return fresh
    return Checkpoint(path, identity, offset, line, records)


@contextlib.contextmanager
def _locked(source: Path) -> Iterator[None]:
    """One importer of a file at a time: two would race on its checkpoint."""
    lock_path = source.with_name(source.name + ".reef-import.lock")
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(f"another `reef import {source}` is running: wait for it to finish")
        yield


def _batches(
    source: Path, checkpoint: Checkpoint, size: int, max_bytes: int
) -> Iterator[tuple[list[Any], int, int]]:
    """(records, offset after them, line after them), from the checkpoint on."""
    records: list[Any] = []
    weight = 0
    with source.open("rb") as data:
        data.seek(checkpoint.offset)
        line_number = checkpoint.line
        while raw := data.readline():
            line_number += 1
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as error:
                fail(f"{source}:{line_number} is not JSON ({error}): fix the line and run again")
            if not isinstance(record, dict):
                fail(f"{source}:{line_number} is not a JSON object: each line is a record")
            if records and (len(records) == size or weight + len(raw) > max_bytes):
                yield records, data.tell() - len(raw), line_number - 1
                records, weight = [], 0
            records.append(record)
            weight += len(raw) + 1
        if records:
            yield records, data.tell(), line_number


def _send(client: ReefClient, scenario: str, records: list[Any], first: bool) -> dict[str, Any]:
    """Post one batch, retrying what may pass (a busy or restarting server, a lost answer)
    with the same ids: the server stores each id once. No server at all on the `first` batch
    is a wrong URL, not worth waiting for."""
    body = {"records": records}
    headers = {"x-reef-scenario": scenario}
    for attempt in range(RETRIES + 1):
        try:
            answer: dict[str, Any] = client.post(BATCH_PATH, body, headers=headers)
            return answer
        except ReefClientError as error:
            passing = error.status in RETRIED or (error.status is None and not first)
            if not passing or attempt == RETRIES:
                raise
            retry_after = error.retry_after or ""
            wait = float(retry_after) if retry_after.isdigit() else 2.0**attempt
            time.sleep(min(wait, 30.0))
    raise AssertionError("unreachable")


def import_records(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="JSONL, one record a line.")
    ],
    scenario: Annotated[str, typer.Option(help="The records' scenario.")] = "default",
    batch_size: Annotated[
        int, typer.Option(min=1, max=MAX_BATCH_RECORDS, help="Records per request.")
    ] = 200,
    batch_bytes: Annotated[
        int, typer.Option(min=1024, max=MAX_BATCH_BYTES, help="Bytes per request, at most.")
    ] = 1024 * 1024,
    restart: Annotated[
        bool, typer.Option("--restart", help="Send the whole file again, from its first line.")
    ] = False,
    url: UrlOption = None,
) -> None:
    """Import records (JSONL envelopes) into a running server; rerun to resume."""
    url = server_url(url)
    source = file.resolve()
    with _locked(source):
        checkpoint = _checkpoint(source, _identity(source, url, scenario), restart)
        size = checkpoint.identity["size"]
        if checkpoint.offset >= size and checkpoint.records:
            console.print(
                f"{escape(str(file))} is imported already ({checkpoint.records} records): "
                "--restart sends it again",
                highlight=False,
                soft_wrap=True,
            )
            return
        if checkpoint.offset:
            console.print(
                f"resuming {escape(str(file))} at line {checkpoint.line + 1} "
                f"({checkpoint.records} records acknowledged before)",
                highlight=False,
                soft_wrap=True,
            )
        checkpoint.save()
        stored = again = 0
        progress = Progress(
            TextColumn("[bold]importing[/] {task.fields[records]} records"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        try:
            with ReefClient(url) as client, progress:
                task = progress.add_task(
                    "import", total=size, completed=checkpoint.offset, records=checkpoint.records
                )
                for records, offset, line in _batches(source, checkpoint, batch_size, batch_bytes):
                    answer = _send(client, scenario, records, first=not stored + again)
                    receipts = answer.get("records")
                    ids = [r.get("agent_record_id") for r in records]
                    if (
                        not isinstance(receipts, list)
                        or [r.get("agent_record_id") for r in receipts if isinstance(r, dict)]
                        != ids
                    ):
                        fail(
                            f"the server did not acknowledge lines {checkpoint.line + 1} to "
                            f"{line}: nothing past line {checkpoint.line} counts as imported"
                        )
                    stored += int(answer.get("imported", 0))
                    again += int(answer.get("duplicates", 0))
                    checkpoint.offset, checkpoint.line = offset, line
                    checkpoint.records += len(records)
                    checkpoint.save()
                    progress.update(task, completed=offset, records=checkpoint.records)
        except ReefClientError as error:
            hint = ", or pass --url" if error.unreachable else ""
            fail(
                f"{error}{hint}. {checkpoint.records} records were acknowledged up to line "
                f"{checkpoint.line}: run the same command again to import the rest"
            )
        except KeyboardInterrupt:
            fail(
                f"interrupted: {checkpoint.records} records acknowledged up to line "
                f"{checkpoint.line}; run the same command again to import the rest",
                code=130,
            )
    console.print(
        f"[green]imported[/] {checkpoint.records} records into scenario {scenario}: "
        f"{stored} stored now, {again} already there",
        highlight=False,
        soft_wrap=True,
    )
