"""Commands that talk to a running server: status, records, report, export."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import add_id_column, console, fail
from reef.client import DEFAULT_URL, ReefClient, ReefClientError
from reef.config import DEFAULT_CONFIG_FILE
from reef.evaluation.live import beside_base, said
from reef.inference.server_file import loopback_url
from reef.protocol import last_user_text, response_text

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="REEF_URL",
        help="The Reef server (token from REEF_TOKEN); default: the project's server.port.",
    ),
]


def server_url(url: str | None, config: Path | None = None) -> str:
    """Where a client command finds the server: --url, then REEF_URL, then the project's config
    (-c FILE, or ./reef.yaml) by its server's host and port, then the default."""
    if url:
        return url
    if config is None and Path(DEFAULT_CONFIG_FILE).is_file():
        config = Path(DEFAULT_CONFIG_FILE)
    if config is None:
        return DEFAULT_URL
    server = project_config(config).server
    return loopback_url(server.host, server.port)


@contextmanager
def open_client(url: str) -> Iterator[ReefClient]:
    """A client of the server at `url` (token from REEF_TOKEN); a call that fails in the block
    ends the command with the client's sentence."""
    try:
        with ReefClient(url) as client:
            yield client
    except ReefClientError as error:
        fail(f"{error}, or pass --url" if error.unreachable else str(error))


def status(
    url: UrlOption = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOption = None,
) -> None:
    """The server's engine, uptime and experience counts per scenario."""
    with open_client(server_url(url, config)) as client:
        data = client.status()
    if as_json:
        console.print_json(data=data)
        return
    engine = data["engine"]
    console.print(
        f"[bold]engine[/] {engine['name']} · model {engine['model']} · {engine['reason']}"
    )
    console.print(
        f"[bold]uptime[/] {data['uptime_s']:.0f}s · store {data['store']['path']} "
        f"({data['store']['size_bytes'] / 1e6:.1f} MB)",
        highlight=False,
    )
    remote = (data.get("releases") or {}).get("remote")
    if remote:
        console.print(_remote_line(remote), highlight=False, markup=True)
    table = Table("scenario", "serving", "records", "reports")
    serving = data.get("serving", {})
    for name in sorted(set(data["store"]["scenarios"]) | set(serving)):
        counts = data["store"]["scenarios"].get(name, {"records": 0, "reports": 0})
        table.add_row(
            name, serving.get(name, "base"), str(counts["records"]), str(counts["reports"])
        )
    console.print(table)
    for name, found in sorted((data.get("release_mismatch") or {}).items()):
        example = (found.get("examples") or [{}])[0]
        said = (
            f"{found['mismatched']} of {found['probed']} gate task(s) answer otherwise "
            f"(e.g. {example.get('task', '?')}: judged {example.get('judged', '')[:60]!r}, "
            f"served {example.get('served', '')[:60]!r})"
        )
        console.print(
            f"[red]{escape(name)}: {escape(found['release_id'])} does not serve as judged[/]: "
            + escape(said),
            highlight=False,
        )
    scenarios = data.get("learning", {}).get("scenarios", {})
    learning = _learning_table(scenarios)
    if learning.row_count:
        console.print(learning)
    progress = _progress_table(scenarios)
    if progress.row_count:
        console.print(progress)
    for line in _below_gate_lines(scenarios):
        console.print(f"[red]{escape(line)}[/]", highlight=False)
    for line in _health_lines(scenarios):
        console.print(line, highlight=False, markup=False)
    for line in _signal_lines(scenarios):
        console.print(line, highlight=False, markup=False)


def _learning_table(scenarios: dict[str, Any]) -> Table:
    """Each learning scenario's mode and learner (the worker holding its lease), and each of
    its recipes with its steps and last one."""
    table = Table("learning", "mode", "learner", "recipe", "steps", "last step")
    for name, found in sorted(scenarios.items()):
        if "plan" not in found:
            continue  # it learned once, and learns no more
        recipes = found.get("recipes", {})
        for configured in found["plan"]:
            step = recipes.get(configured["name"], {})
            last = step.get("last_step") or {}
            outcome = str(last.get("outcome", "-"))
            if last.get("error") or last.get("detail"):
                outcome += f": {last.get('error') or last['detail']}"
            steps = str(step.get("steps", 0))
            learner = str(found.get("learner") or "-")
            row = (name, found.get("mode", ""), learner, configured["recipe"], steps, outcome)
            table.add_row(*row)
    return table


def _progress_table(scenarios: dict[str, Any]) -> Table:
    """Is it learning: each release's live pass rate, users' reports and the recipe's scorer,
    each as passed/calls, the rate and its 95% interval."""
    columns = ("scenario", "release", "served", "reports passed", "scorer accepts")
    table = Table(*columns, "vs the base on its calls", "gate said (feedback)")
    table.title = "live pass rate per release (95% interval)"
    for name, found in sorted(scenarios.items()):
        for release in found.get("progress") or []:
            table.add_row(
                name,
                release["release_id"],
                str(release["served"]),
                said(release["reports"]),
                said(release["scorer"]),
                beside_base(release),
                said(release.get("gate")),
            )
    return table


def _below_gate_lines(scenarios: dict[str, Any]) -> list[str]:
    """A line per release whose live rate fell below what its gate predicted."""
    return [
        f"{name}: {release['release_id']} serves below its gate: {release['below_gate']}"
        for name, found in sorted(scenarios.items())
        for release in found.get("progress") or []
        if release.get("below_gate")
    ]


def _health_lines(scenarios: dict[str, Any]) -> list[str]:
    """A line per release its gate measured: what it forgot, and what it carried to prompts it
    never learned from (`reef.evaluation.health`)."""
    return [
        f"health {name}: {release['release_id']} {release['health']['said']}"
        for name, found in sorted(scenarios.items())
        for release in found.get("progress") or []
        if (release.get("health") or {}).get("said", "-") != "-"
    ]


def _signal_lines(scenarios: dict[str, Any]) -> list[str]:
    """What became of each scenario's feedback: reports, learned from, held out, dropped."""
    lines = []
    for name, found in sorted(scenarios.items()):
        signal = found.get("signal")
        if not signal:
            continue
        dropped = ", ".join(f"{n} {why}" for why, n in sorted(signal["dropped"].items()))
        lines.append(
            f"signal {name}: {signal['reports']} report(s){_by_source(signal)}, "
            f"{signal['learned_from']} call(s) "
            f"learned from, {signal.get('held_out', 0)} held out for the gate, dropped: "
            f"{dropped or 'none'}"
        )
    return lines


def _by_source(signal: dict[str, Any]) -> str:
    """" (10 users', 2 the teacher's)": who wrote the reports, when not users alone."""
    found = signal.get("reports_by_source") or {}
    if not found.get("teacher") and not found.get("imported"):
        return ""
    names = (("user", "users'"), ("teacher", "the teacher's"), ("imported", "imported"))
    return " (" + ", ".join(f"{found[key]} {said}" for key, said in names if found.get(key)) + ")"


def _remote_line(remote: dict[str, Any]) -> str:
    """Where the replicas' release chain is, and whether this server reaches it."""
    if remote["reachable"] is None:
        state = "not reached yet"
    elif remote["reachable"]:
        state = "reachable"
    else:
        state = f"unreachable ({escape(str(remote['error']))}): serving what it has"
    diverged = remote.get("diverged") or []
    behind = f" · local chain not on the remote: {', '.join(diverged)}" if diverged else ""
    return f"[bold]releases[/] from {escape(remote['url'])} · {state}{escape(behind)}"


def records(
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    tag: Annotated[
        list[str] | None,
        typer.Option(help="Only records with this tag, NAME:VALUE (x-reef-tag-NAME); repeatable."),
    ] = None,
    search: Annotated[
        str | None,
        typer.Option(help="Only records whose request or answer holds every one of these words."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """The most recent records with their feedback."""
    with open_client(server_url(url, config)) as client:
        page = client.records(scenario, limit=limit, order="desc", tags=tag, search=search)
        rows = list(page["data"])
    if as_json:
        console.print_json(data=rows)
        return
    if console.width >= WIDE_RECORDS:
        console.print(_records_table(rows))
    else:  # a table's texts would be cut to a few letters: one block per record instead
        for row in rows:
            console.print(_record_block(row), highlight=False, markup=False, soft_wrap=False)


# Terminals at least this wide show the records as a table; narrower, one block per record.
WIDE_RECORDS = 120


def _record_columns(rows: list[dict[str, Any]]) -> dict[str, Callable[[dict[str, Any]], str]]:
    """What is shown of each record, by header: a column only where some row has something to
    say in it (the scenario when there are several, what a recipe concluded when one did)."""
    columns: dict[str, Callable[[dict[str, Any]], str]] = {
        "time": lambda row: datetime.fromtimestamp(row["created_at"]).strftime("%H:%M:%S"),
        "scenario": lambda row: row["scenario"],
        "release": lambda row: row["release_id"],
        "prompt": lambda row: _short(last_user_text(row["request"].get("messages", []))),
        "answer": lambda row: _short(response_text(row["response"])),
        "feedback": lambda row: _short("; ".join(_describe_report(r) for r in row["reports"])),
        "learned as": lambda row: _short(
            "; ".join(_describe_annotation(a) for a in row.get("annotations", []))
        ),
    }
    if len({row["scenario"] for row in rows}) <= 1:
        del columns["scenario"]
    if not any(row.get("annotations") for row in rows):
        del columns["learned as"]
    return columns


def _records_table(rows: list[dict[str, Any]]) -> Table:
    """The records as a table: ids whole (they are pasted into `reef report`)."""
    columns = _record_columns(rows)
    table = Table(show_lines=False)
    add_id_column(table, "record", (row["id"] for row in rows))
    for header in columns:
        table.add_column(header, no_wrap=header in ("time", "release", "scenario"))
    for row in rows:
        table.add_row(row["id"], *(cell(row) for cell in columns.values()))
    return table


def _record_block(row: dict[str, Any]) -> str:
    """One record in a few lines, for a narrow terminal: its id, time, scenario and release,
    then each text on its own line, wrapped by the terminal."""
    columns = _record_columns([row])
    said = {header: cell(row) for header, cell in columns.items()}
    head = " · ".join(said.pop(h) for h in ("time", "release") if h in said)
    lines = [f"{row['id']}  {row['scenario']} · {head}"]
    lines += [f"  {header}: {text}" for header, text in said.items() if text]
    return "\n".join(lines)


def _all_records(client: ReefClient, scenario: str | None) -> Iterator[dict[str, Any]]:
    """Every record, oldest first, a page at a time."""
    after = None
    while True:
        page = client.records(scenario, limit=1000, after=after)
        yield from page["data"]
        if not page["has_more"] or not page["data"]:
            return
        after = page["data"][-1]["id"]


def report(
    receipts: Annotated[list[str], typer.Argument(help="Record ids (x-reef-agent-record-id).")],
    score: Annotated[float | None, typer.Option(help="A finite number.")] = None,
    feedback: Annotated[str | None, typer.Option(help="Free text.")] = None,
    scenario: Annotated[str, typer.Option(help="The records' scenario.")] = "default",
    report_id: Annotated[str | None, typer.Option(help="Idempotency key.")] = None,
    clamp: Annotated[
        bool, typer.Option(help="Store a score outside the range at its nearer edge.")
    ] = False,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Report a score and/or feedback against one or more receipts."""
    if score is None and feedback is None:
        fail("give --score, --feedback or both", code=2)
    with open_client(server_url(url, config)) as client:
        stored = client.report(
            receipts, score, feedback, scenario=scenario, report_id=report_id, clamp=clamp
        )
    console.print(f"[green]reported[/] {stored['id']} on {len(stored['references'])} record(s)")
    for warning in stored.get("warnings") or []:
        console.print(f"[yellow]note[/] {escape(warning)}", highlight=False)


def export(
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File (default: stdout).")
    ] = None,
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Write trajectories as JSONL in OpenAI's chat fine-tuning shape, with their feedback."""
    with open_client(server_url(url, config)) as client:
        rows = list(_all_records(client, scenario))
    from reef.learning.trajectories import trajectories  # the SDK's view: only for an export

    lines = [json.dumps(t, ensure_ascii=False) for t in trajectories(rows)]
    text = "".join(line + "\n" for line in lines)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        console.print(f"[green]wrote[/] {len(lines)} trajectories to {output}", highlight=False)


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _describe_annotation(annotation: dict[str, Any]) -> str:
    """A recipe's conclusion about a record, e.g. `openclaw_rl: -1 by model (-1 -1 0): be brief`."""
    parts = [f"{annotation['source']}:"]
    if annotation.get("score") is not None:
        parts.append(f"{annotation['score']:+g}")
    if annotation.get("judge"):
        parts.append(f"by {annotation['judge']}")
    if annotation.get("votes"):
        parts.append("(" + " ".join(f"{vote['score']:+d}" for vote in annotation["votes"]) + ")")
    if annotation.get("hint"):
        parts[-1] += ":"
        parts.append(str(annotation["hint"]))
    return " ".join(parts)


def _describe_report(report: dict[str, Any]) -> str:
    parts = []
    if report.get("score") is not None:
        parts.append(f"{report['score']:g}")
    if report.get("feedback") is not None:
        feedback = report["feedback"]
        parts.append(feedback if isinstance(feedback, str) else json.dumps(feedback))
    return " ".join(parts)
