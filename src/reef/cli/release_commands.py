"""`reef release …`: the release chain and candidates, acting on the stores directly.

These commands need file access to the state folder, not a token, and work whether or not a
server is running; a running server follows the heads they move. Exit codes: 0 done, 1 error,
2 bad usage or config, 3 the head moved (another publisher was first).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.syntax import Syntax
from rich.table import Table

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import add_id_column, as_text, console, fail
from reef.config import ReefConfig
from reef.errors import ReefError
from reef.evaluation.health import Health, chain_health
from reef.evaluation.runner import Generate, TaskResult, model_generate
from reef.evaluation.tasks import load_tasks, tasks_path
from reef.inference.model import open_model
from reef.releases.chain import (
    ARTIFACT_KINDS,
    CURRENT_HEAD,
    Release,
    ReleaseConflict,
    is_weight_file,
    lfs_size,
    read_folder,
    text_diff,
)
from reef.releases.shadowing import start_shadow
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.store.candidates import Candidate, is_candidate_id

app = typer.Typer(
    help="Releases and candidates: list, show, diff, approve, roll back, publish.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
CONFLICT_EXIT = 3


@contextmanager
def _workflow(config_path: Path | None) -> Iterator[ReleaseWorkflow]:
    config = project_config(config_path)
    try:
        store = ExperienceStore(config.experience_store, config.store.synchronous)
    except ReefError as error:
        fail(error.message)
    try:
        yield ReleaseWorkflow(config, store)
    except ReleaseConflict as conflict:
        fail(conflict.message, code=CONFLICT_EXIT)
    except ReefError as error:
        fail(error.message, code=2 if error.status == 400 else 1)
    finally:
        store.close()


# The head the caller last saw: refuse (exit 3, a conflict) if another publish moved it since.
ExpectedHeadOption = Annotated[
    str | None,
    typer.Option(help="Only if the head is still this release (what you reviewed)."),
]


def _print_json(data: Any) -> None:
    console.print_json(data=data)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


# Terminals at least this wide show releases and candidates as tables; narrower, one block each
# (at 80 columns a table left their reasons a word a line: about 45 lines a release).
WIDE_TABLES = 120


def _print_block(block: str) -> None:
    console.print(as_text(block), highlight=False, soft_wrap=False)


def _release_block(release: Release, health: Health | None = None) -> str:
    """One release in a few lines: its id, kind, parent, time and candidate, its health, then
    its reason, wrapped by the terminal."""
    head = " · ".join(
        [release.kind, f"after {release.parent_release_id or '-'}", _when(release.created_at)]
    )
    lines = [f"{release.release_id}  {head}", f"  candidate: {release.candidate_id or '-'}"]
    if health and health.said() != "-":
        lines.append(f"  health: {health.said()}")
    if release.reason:
        lines.append(f"  reason: {release.reason}")
    return "\n".join(lines)


def _candidate_block(candidate: Candidate) -> str:
    """One candidate in a few lines: its id, scenario, kind, state and base, what it lost, then
    the gate's decision, wrapped by the terminal."""
    head = " · ".join(
        [candidate.scenario, candidate.kind, candidate.state, candidate.base_release_id or "-"]
    )
    lines = [f"{candidate.id}  {head}"]
    lost = _lost(candidate)
    if lost:
        lines.append(f"  lost: {lost}")
    if candidate.decision:
        lines.append(f"  decision: {candidate.decision}")
    return "\n".join(lines)


def _releases_table(releases: list[Release], health: dict[str, Health] | None = None) -> Table:
    table = Table()
    add_id_column(table, "release", (r.release_id for r in releases))
    for header in ("kind", "parent", "created"):
        table.add_column(header)
    add_id_column(table, "candidate", (r.candidate_id or "-" for r in releases))
    if health is not None:
        table.add_column("health (forgetting; transfer)")
    table.add_column("reason")
    for release in releases:
        found = (health or {}).get(release.release_id)
        said = [found.said() if found else "-"] if health is not None else []
        table.add_row(
            release.release_id,
            release.kind,
            release.parent_release_id or "-",
            _when(release.created_at),
            release.candidate_id or "-",
            *said,
            release.reason or "",
        )
    return table


def _health_of(releases: list[Release]) -> dict[str, Health]:
    """Each listed release's forgetting and transfer (`reef.evaluation.health`), its scenario's
    chain read oldest first (newest first as listed)."""
    found: dict[str, Health] = {}
    for scenario in dict.fromkeys(r.scenario for r in releases):
        chain = [(r.release_id, r.evaluation) for r in releases if r.scenario == scenario]
        found |= chain_health(chain[::-1])
    return found


@app.command("list")
def list_releases(
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each scenario's releases, newest first."""
    with _workflow(config) as workflow:
        scenarios = [scenario] if scenario else workflow.chain.scenarios()
        releases = [r for name in scenarios for r in workflow.chain.releases(name)]
    health = _health_of(releases)
    if as_json:
        _print_json([r.to_json() | {"health": health[r.release_id].to_json()} for r in releases])
    elif not releases:
        console.print("no releases yet: `reef release publish DIR --scenario S --kind harness`")
    elif console.width >= WIDE_TABLES:
        console.print(_releases_table(releases, health))
    else:  # a table's reasons would wrap one word a line: one block per release instead
        for release in releases:
            _print_block(_release_block(release, health.get(release.release_id)))


@app.command()
def show(release_id: str, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """One release: its manifest and files; or one candidate (cand_…): its state, evaluation,
    files and diff against the release it was built on."""
    if is_candidate_id(release_id):
        _show_candidate(release_id, config, as_json)
        return
    with _workflow(config) as workflow:
        release = workflow.chain.get(release_id)
        files = workflow.chain.files(release_id)
    if as_json:
        _print_json({**release.to_json(), "files": {p: len(d) for p, d in files.items()}})
        return
    console.print(_releases_table([release]))
    console.print(f"parts: {', '.join(release.carried_parts) or 'none'}", highlight=False)
    if release.evaluation:
        summary = {k: v for k, v in release.evaluation.items() if k != "results"}
        console.print(f"evaluation: {json.dumps(summary)}", highlight=False)
    table = Table("file", "bytes")
    for path, data in sorted(files.items()):
        table.add_row(path, str(len(data)))
    console.print(table)
    if release.diff:
        console.print(Syntax(release.diff, "diff", theme="ansi_dark"))


def _show_candidate(candidate_id: str, config: Path | None, as_json: bool) -> None:
    with _workflow(config) as workflow:
        candidate = workflow.candidates.get(candidate_id)
        files = read_folder(candidate.folder) if candidate.folder.is_dir() else {}
        base = candidate.base_release_id
        before = workflow.chain.stored_files(base) if base else {}
    changes = text_diff(before, files, base or "base", candidate_id) if files else ""
    if as_json:
        sizes = {path: len(data) for path, data in files.items()}
        _print_json({**candidate.to_json(), "files": sizes, "diff": changes})
        return
    console.print(
        f"[bold]{candidate.id}[/] · {candidate.scenario} · {candidate.kind} · "
        f"[bold]{candidate.state}[/] · built on {base or 'base'}",
        highlight=False,
    )
    for label, text in (("reason", candidate.reason), ("decision", candidate.decision)):
        if text:
            console.print(f"{label}: {text}", highlight=False, markup=False)
    if candidate.evaluation:
        summary = {k: v for k, v in candidate.evaluation.items() if k != "results"}
        console.print(f"evaluation: {json.dumps(summary)}", highlight=False, markup=False)
    if not files:
        console.print("its files were pruned (retention.candidates)", highlight=False)
    elif changes:
        console.print(Syntax(changes, "diff", theme="ansi_dark"))


@app.command()
def diff(a: str, b: str, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """File diffs between two harness releases; size and metric differences for weights."""
    with _workflow(config) as workflow:
        first, second = workflow.chain.get(a), workflow.chain.get(b)
        # As git stores them: weights stay LFS pointers, compared and sized without reading them.
        stored_a, stored_b = workflow.chain.stored_files(a), workflow.chain.stored_files(b)
    text_diffs: dict[str, str] = {}
    changed: dict[str, dict[str, list[int]]] = {}
    for path in sorted(set(stored_a) | set(stored_b)):
        old, new = stored_a.get(path), stored_b.get(path)
        if old == new:
            continue
        if is_weight_file(path):
            changed[path] = {"bytes": [lfs_size(old), lfs_size(new)]}
        else:
            only = ({path: old} if old is not None else {}, {path: new} if new is not None else {})
            text_diffs[path] = text_diff(*only, a, b)
    metrics = _metric_differences(first, second)
    parts = [first.carried_parts, second.carried_parts]
    if as_json:
        _print_json({"parts": parts, "files": text_diffs, "weights": changed, "metrics": metrics})
        return
    if parts[0] != parts[1]:
        console.print(f"parts: {' + '.join(parts[0])} -> {' + '.join(parts[1])}", highlight=False)
    for text in text_diffs.values():
        console.print(Syntax(text, "diff", theme="ansi_dark"))
    for path, sizes in changed.items():
        console.print(f"{path}: {sizes['bytes'][0]} -> {sizes['bytes'][1]} bytes")
    for name, (old_value, new_value) in metrics.items():
        console.print(f"{name}: {old_value} -> {new_value}", highlight=False)
    if not (text_diffs or changed):
        console.print("same files")


def _metric_differences(a: Release, b: Release) -> dict[str, tuple[Any, Any]]:
    def means(release: Release) -> dict[str, Any]:
        evaluation = release.evaluation or {}
        return {
            "candidate_mean": evaluation.get("candidate_mean"),
            "records_consumed": release.records_consumed,
            "content_hash": release.content_hash,
        }

    old, new = means(a), means(b)
    return {k: (old[k], new[k]) for k in old if old[k] != new[k]}


LOST_WIDTH = 30  # characters of lost task ids a candidates table keeps whole


def _candidates_table(candidates: list[Candidate]) -> Table:
    colour = {"released": "green", "rejected": "red", "held": "yellow"}
    table = Table()
    add_id_column(table, "candidate", (c.id for c in candidates))
    # What each lost, second: a reviewer reads regressions before anything else.
    lost = [_lost(c) for c in candidates]
    width = min(LOST_WIDTH, max((len(text) for text in lost), default=0))
    table.add_column("lost", no_wrap=True, min_width=max(width, len("lost")), style="bold red")
    for name in ("scenario", "kind", "state", "base", "decision"):
        table.add_column(name)
    for c, its_losses in zip(candidates, lost, strict=True):
        state = f"[{colour.get(c.state, 'white')}]{c.state}[/]"
        table.add_row(
            c.id, its_losses, c.scenario, c.kind, state, c.base_release_id or "-", c.decision or ""
        )
    return table


def _lost(candidate: Candidate) -> str:
    """The tasks the candidate scored lower on than the release it was built on, first ones
    named: what a reviewer should look at before anything else."""
    lost = (candidate.evaluation or {}).get("lost") or []
    return ", ".join(lost[:2]) + (f" +{len(lost) - 2}" if len(lost) > 2 else "")


@app.command()
def candidates(
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    state: Annotated[
        str | None,
        typer.Option(help="proposed, evaluating, released, rejected, held, canary, shadow"),
    ] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Candidates, newest first, with the gate's decision."""
    with _workflow(config) as workflow:
        found = workflow.candidates.list(scenario, state)
    if as_json:
        _print_json([c.to_json() for c in found])
    elif console.width >= WIDE_TABLES:
        console.print(_candidates_table(found))
    else:  # a table's decisions would wrap one word a line: one block per candidate instead
        for candidate in found:
            _print_block(_candidate_block(candidate))


@app.command()
def approve(
    candidate_id: str,
    reason: Annotated[str | None, typer.Option(help="Why, for the release's record.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Release it though the gate scored it worse.")
    ] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Release a held candidate, or promote one on a canary. One the gate scored worse than
    what serves, or never evaluated, needs --force; exit 3 if the head moved since (then
    `reef release regate`)."""
    with _workflow(config) as workflow:
        candidate = workflow.approve(candidate_id, reason, force)
    _report_candidate(candidate, as_json)


@app.command()
def regate(
    candidate_id: str,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Gate a held candidate again against its scenario's head (one built on a head that has
    moved since): proposed anew on the head, keeping the parts released meanwhile, and gated
    with the model loaded here, on the tasks its first gate had; the old candidate ends as
    superseded once the new evaluation is complete (interrupted, it stays as it was)."""
    with _workflow(config) as workflow:
        old, candidate = asyncio.run(_regate(workflow, candidate_id))
    if not as_json:
        console.print(f"{old.id} ({old.state}): {old.decision}", highlight=False, soft_wrap=True)
    _report_candidate(candidate, as_json)
    if candidate.state == "rejected":
        raise typer.Exit(1)


@app.command()
def canary(
    candidate_id: str,
    share: Annotated[int, typer.Option(help="Percent of sessions the candidate serves.")] = 10,
    reason: Annotated[str | None, typer.Option(help="Why, for the release's record.")] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Though the gate scored it worse, or never evaluated it."),
    ] = False,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put a held candidate on a canary: SHARE percent of sessions, judged on their reports
    (`gate.canary`), promoted or rolled back automatically; approve or reject ends it early.
    One the gate scored worse, or never evaluated, needs --force, as `approve` does."""
    with _workflow(config) as workflow:
        candidate = workflow.canary(candidate_id, share, reason, force)
    _report_candidate(candidate, as_json)


@app.command()
def shadow(
    candidate_id: str,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Have a held candidate answer copies of live calls, never heard, on idle capacity; its
    answers are stored beside the live ones (`reef review` shows them side by side)."""
    with _workflow(config) as workflow:
        candidate = start_shadow(workflow.candidates, candidate_id)
    _report_candidate(candidate, as_json)


@app.command()
def reject(
    candidate_id: str,
    reason: Annotated[str, typer.Option(help="Why it is rejected.")],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Reject a held, proposed or evaluating candidate (its gate stops), or roll a canary back."""
    with _workflow(config) as workflow:
        candidate = workflow.reject(candidate_id, reason)
    _report_candidate(candidate, as_json)


@app.command()
def rollback(
    scenario: Annotated[str, typer.Option(help="The scenario to roll back.")] = "default",
    to: Annotated[
        str | None,
        typer.Option(
            help="Release to return to (default: the previous); base: the model alone, "
            "as before the first release."
        ),
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the release's record.")] = None,
    expected_head: ExpectedHeadOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a new release equal to an earlier one (every part: harness and adapter)."""
    with _workflow(config) as workflow:
        release = workflow.chain.rollback(
            scenario, to, reason, expected_head=expected_head or CURRENT_HEAD
        )
    _report_release(release, as_json)


@app.command()
def promote(
    release_id: str,
    scenario: Annotated[
        str | None, typer.Option(help="Target scenario (default: its own).")
    ] = None,
    expected_head: ExpectedHeadOption = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the release's record.")] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a new release equal to RELEASE_ID (every part), in its scenario or another."""
    with _workflow(config) as workflow:
        release = workflow.chain.promote(
            release_id, scenario, reason, expected_head=expected_head or CURRENT_HEAD
        )
    _report_release(release, as_json)


@app.command()
def publish(
    folder: Annotated[Path, typer.Argument(help="The artifact folder.")],
    kind: Annotated[
        str, typer.Option(help="harness, lora, or agent (a harness and an adapter together).")
    ],
    scenario: Annotated[str, typer.Option(help="The scenario it is for.")] = "default",
    approve_now: Annotated[
        bool, typer.Option("--approve", help="Release without the gate.")
    ] = False,
    reason: Annotated[str | None, typer.Option(help="Why this candidate.")] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Turn a folder into a candidate and run the gate (or release it with --approve)."""
    if kind not in ARTIFACT_KINDS:
        fail(f"--kind must be one of {', '.join(ARTIFACT_KINDS)}", code=2)
    with _workflow(config) as workflow:
        candidate = workflow.propose(scenario, kind, read_folder(folder), "cli", reason)
        if approve_now:  # the admin's named decision to skip the gate: said in the release
            said = reason or "published with --approve"
            candidate = workflow.approve(candidate.id, said, force=True)
        else:
            candidate = asyncio.run(_run_gate(workflow, candidate))
    _report_candidate(candidate, as_json)
    if candidate.state == "rejected":
        raise typer.Exit(1)


async def _run_gate(workflow: ReleaseWorkflow, candidate: Candidate) -> Candidate:
    config: ReefConfig = workflow.config
    try:
        total: int | None = len(load_tasks(tasks_path(config.evals_dir, candidate.scenario)))
    except ReefError:
        total = None  # the gate will reject it and say why
    if config.gate_for(candidate.scenario).episodes is not None:
        total = None  # episodes besides (or instead of) the chat tasks: counted as they end

    async def gate(generate: Generate, on_task: OnTask) -> Candidate:
        return await workflow.gate(candidate, generate, on_task)

    return await _with_model(workflow, candidate.scenario, candidate.id, total, gate)


async def _regate(workflow: ReleaseWorkflow, candidate_id: str) -> tuple[Candidate, Candidate]:
    """Re-gate with the model loaded first: an interrupt while it loads leaves the old
    candidate as it was and proposes nothing."""
    scenario = workflow.candidates.get(candidate_id).scenario

    async def regate(generate: Generate, on_task: OnTask) -> tuple[Candidate, Candidate]:
        return await workflow.regate(candidate_id, generate, on_task)

    return await _with_model(workflow, scenario, candidate_id, None, regate)


OnTask = Callable[[TaskResult], None]
T = TypeVar("T")


async def _with_model(
    workflow: ReleaseWorkflow,
    scenario: str,
    label: str,
    total: int | None,
    run: Callable[[Generate, OnTask], Awaitable[T]],
) -> T:
    """`run` a gate on the model loaded here, with a progress bar of `total` tasks; under the
    `always` policy, with no model (it evaluates nothing)."""
    config: ReefConfig = workflow.config
    if config.gate_for(scenario).policy == "always":
        return await run(_no_generation, lambda _: None)
    async with open_model(config) as model:
        columns = (
            TextColumn("evaluating {task.description} on " + model.name),
            BarColumn(),
            MofNCompleteColumn(),
        )
        with Progress(*columns, console=console, transient=True) as progress:
            bar = progress.add_task(label, total=total)
            generate = model_generate(model, workflow.eval_settings(scenario))
            return await run(generate, lambda _: progress.advance(bar))


async def _no_generation(*_: Any) -> str:
    raise AssertionError("the `always` policy evaluates nothing")


def _report_candidate(candidate: Candidate, as_json: bool) -> None:
    if as_json:
        _print_json(candidate.to_json())
        return
    colours = {"released": "green", "rejected": "red", "held": "yellow", "canary": "cyan"}
    colour = colours.get(candidate.state, "white")
    console.print(
        f"candidate {candidate.id} ({candidate.kind}, {candidate.scenario}): "
        f"[{colour}]{candidate.state}[/]",
        highlight=False,
        soft_wrap=True,
    )
    if candidate.decision:
        console.print(f"  {candidate.decision}", highlight=False, soft_wrap=True)
    if candidate.release_id and candidate.state == "canary":
        console.print(f"  [cyan]on a canary[/] as {candidate.release_id}", highlight=False)
    elif candidate.release_id and candidate.state == "released":
        console.print(f"  [green]released[/] as {candidate.release_id}", highlight=False)
    elif candidate.release_id:  # a canary that ended without being promoted
        console.print(f"  [red]rolled back[/]: its canary {candidate.release_id} stopped serving")


def _report_release(release: Release, as_json: bool) -> None:
    if as_json:
        _print_json(release.to_json())
    else:
        console.print(f"[green]released[/] {release.release_id} ({release.reason})")
