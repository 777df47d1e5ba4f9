"""`reef learn`, `reef train`, `reef recipe list|new`: the learning loop from the command line."""

from __future__ import annotations

import asyncio
import contextlib
import keyword
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from reef.cli.client_commands import UrlOption, open_client, server_url
from reef.cli.options import ConfigOption, project_config
from reef.cli.output import console, fail
from reef.config import ReefConfig
from reef.errors import ReefError
from reef.inference.model import Model, open_model
from reef.learning.plans import LoadedPlan, load_plans
from reef.learning.worker import LearningWorker
from reef.sdk.recipe import RecipeError, installed_recipes, recipe_class
from reef.store import ExperienceStore
from reef.templates import environment

recipe_app = typer.Typer(
    help="Learning recipes: list the installed ones, scaffold a new one.", no_args_is_help=True
)


def _config(path: Path | None) -> ReefConfig:
    config = project_config(path)
    if not config.learning_plans():
        fail(
            "no recipe configured: set learning.recipe in reef.yaml (e.g. harness_evolve), or "
            "scenarios.NAME.learning.recipe",
            code=2,
        )
    return config


def learn(
    once: Annotated[bool, typer.Option("--once", help="One step now, then exit.")] = False,
    scenario: Annotated[str | None, typer.Option(help="Only this scenario.")] = None,
    config: ConfigOption = None,
) -> None:
    """Run the learning worker in the foreground (`--once`: one step, for debugging)."""
    resolved = _config(config)
    try:
        asyncio.run(_learn(resolved, once, scenario))
    except ReefError as error:
        fail(error.message, code=2 if error.status == 400 else 1)
    except KeyboardInterrupt:
        pass


async def _learn(config: ReefConfig, once: bool, scenario: str | None) -> None:
    plans = load_plans(config)
    if scenario is not None:
        plans = [plan for plan in plans if plan.scenario == scenario]
        if not plans:
            raise RecipeError(f"scenario {scenario!r} does not learn: it has no recipe configured")
    store = ExperienceStore(config.experience_store, config.store.synchronous)
    try:
        async with contextlib.AsyncExitStack() as stack:
            with console.status("opening the model (the running server's, or loading one)…"):
                model = await stack.enter_async_context(open_model(config))
            await _learn_with(config, plans, store, model, once)
    finally:
        store.close()


async def _learn_with(
    config: ReefConfig,
    plans: list[LoadedPlan],
    store: ExperienceStore,
    model: Model,
    once: bool,
) -> None:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bars:
        worker = LearningWorker(config, store, model, _progress_bars(bars), plans=plans)
        if not once:
            await worker.run(asyncio.Event())
            return
        results = []
        for lane in worker.lanes.values():
            for learner in lane.learners:
                name = f"{learner.recipe.name} on {lane.scenario}"
                console.print(f"one step of {name} with {model.name}", highlight=False)
                results.append((name, await worker.step_learner(learner, force=True)))
    for name, result in results:
        colour = {"released": "green", "rejected": "red", "error": "red"}.get(
            result.outcome, "yellow"
        )
        console.print(
            f"{name}: [{colour}]{result.outcome}[/] {result.detail}",
            highlight=False,
            soft_wrap=True,
        )


def _progress_bars(bars: Progress) -> Callable[[str, int, int, float | None], None]:
    """A recipe's progress reports as rich bars, one per stage (called from the recipe's thread)."""
    tasks: dict[str, TaskID] = {}

    def report(stage: str, done: int, total: int, loss: float | None) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total, loss="")
        shown = f"loss {loss:.4f}" if loss is not None else ""
        bars.update(tasks[stage], completed=done, total=total, loss=shown)

    return report


def train(
    instruction: Annotated[str, typer.Argument(help="What the next learning step should aim for.")],
    scenario: Annotated[str, typer.Option(help="The scenario.")] = "default",
    url: UrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Queue a training instruction for the running server's learning worker."""
    with open_client(server_url(url, config)) as client:
        queued = client.train(instruction, scenario)
    console.print(f"[green]queued[/] {queued['id']} for {scenario}")


@recipe_app.command("list")
def list_recipes() -> None:
    """The installed recipes (Reef's own and any package's): what signal they learn from, how,
    and what they change."""
    table = Table("recipe", "package", "signal", "experience", "target")
    for name, package in installed_recipes().items():
        try:
            cls = recipe_class(name)
        except RecipeError as error:  # a broken package's recipe: say so, list the others
            table.add_row(name, package, f"[red]{error.message}[/]", "", "")
            continue
        table.add_row(name, package, cls.signal, cls.experience, cls.target)
    console.print(table)


@recipe_app.command("new")
def new_recipe(
    name: Annotated[str, typer.Argument(help="Python identifier, e.g. polite_answers.")],
    directory: Annotated[Path, typer.Option(help="Where recipes/ is.")] = Path("."),
) -> None:
    """Scaffold recipes/NAME/ with a recipe and a test that passes as generated."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        fail(f"{name!r} is not a lowercase Python identifier", code=2)
    folder = directory / "recipes" / name
    if folder.exists():
        fail(f"{folder} already exists; nothing was written")
    class_name = "".join(part.capitalize() for part in name.split("_"))
    env = environment()
    folder.mkdir(parents=True)  # recipes/ itself stays a namespace package: no __init__.py
    for template, target in (
        ("__init__.py.j2", "__init__.py"),
        ("recipe.py.j2", "recipe.py"),
        ("test_recipe.py.j2", "test_recipe.py"),
    ):
        text = env.get_template(f"recipe/{template}").render(name=name, class_name=class_name)
        (folder / target).write_text(text)
        console.print(f"[green]wrote[/] {folder / target}")
    console.print(
        f"Use it with `learning: {{recipe: recipes/{name}/recipe.py:{class_name}}}`; "
        f"test it with `pytest {folder}`",
        highlight=False,
    )
