"""The four harness recipes on one budget of metric calls: a preference and the episode suite.

    .venv/bin/python -m bench.learning.harness_episodes [--recipes
        harness_evolve,gepa,skills,meta_harness]
        [--metric-calls 60] [--rounds 3] [--budget 900] [--preference sure|none]

(a) The preference (`--preference`, default `sure`), as `bench.learning.preferences --metric-calls`
runs it: a scripted user's feedback on chat answers, the held-out prompts' pass rate and the
correctness tasks, each recipe in its own project. (b) The episode suite, below.

For each recipe, in a fresh project made by `reef init`: `reef serve` on the embedded
SmolLM2-135M, the episode gate on the held-out suite below (Reef's native agent in bubblewrap,
`policy: no_regression`), and the recipe configured as docs/recipes.md shows it. `gepa`,
`skills` and `meta_harness` search with `episodes` set: every tree they try is scored by the
agent's episodes under it on the shipped suite (`evals/tasks/`, four Harbor tasks; one metric
call an episode), never on the gate's (issue 76: before, they searched on the gate's suite);
`harness_evolve` learns as it always does, from the agent's recorded calls and the reports the
tests wrote on them. Round by round, the agent runs the suite under what serves
(those episodes are the experience: recorded, each test's reward a report on its calls), then
the worker steps; rounds go on, up to `--rounds`, until the steps have spent `--metric-calls`
(the search's episodes, the gate's episodes and chat answers, as `/reef/status` counts them).

Held out: four tasks of the same kinds on other files and words (`bench/learning/episode_tasks/`),
run
under the tree that serves, before and after each round, through a trial tree (the tree's
files written under the state folder, `reef.inference.trials`), so measuring is never recorded
and never becomes experience. The correctness tasks are the chat tasks `reef init` writes.
Figures to bench/out/harness-episodes.json, the curve of held-out pass rate against metric calls
to docs/harness_episodes_calls.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common.preferences import PREFERENCES, metric_calls_so_far, next_steps, steps_so_far
from bench.common.preferences import run as run_preference
from bench.common.results import OUT
from reef.artifacts import files_of
from reef.config import ReefConfig, load_config
from reef.episodes.project import project_episodes
from reef.episodes.tokens import trial_tree
from reef.inference.trials import write_trial
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import free_port, reef_serve
from reef.testing.scripted_user import correct

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "evals" / "tasks"
HELD_OUT = ROOT / "bench" / "learning" / "episode_tasks"
RECIPES = ["harness_evolve", "gepa", "skills", "meta_harness"]
# Each recipe as docs/recipes.md shows it, with a step's own budget sized to the suite's four
# tasks (a gate of 8 episodes comes on top of every step that proposes).
SETTINGS: dict[str, dict[str, Any]] = {
    "harness_evolve": {"proposer": "hindsight", "batch_size": 4},
    "gepa": {
        "batch_size": 4,
        "episodes": {"tasks": str(SUITE)},
        "pareto_size": 4,
        "minibatch_size": 2,
        "max_metric_calls": 24,
    },
    "skills": {"batch_size": 4, "episodes": {"tasks": str(SUITE)}},
    "meta_harness": {"batch_size": 4, "episodes": {"tasks": str(SUITE)}, "max_nodes": 4},
}
console = Console(width=140)


def make_project(folder: Path, recipe: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "reef", "init"], cwd=folder, check=True, capture_output=True
    )
    learning = {"recipe": recipe, **SETTINGS[recipe]}
    lines = [f"  {key}: {json.dumps(value)}" for key, value in learning.items()]
    (folder / "reef.yaml").write_text(
        "gate:\n  policy: no_regression\n"
        f"  episodes:\n    tasks: {HELD_OUT}\n    agent: native\n    repeats: 1\n"
        "episodes:\n  wall_time_s: 180\n  max_steps: 4\n"
        "learning:\n" + "\n".join(lines) + "\n"
    )
    return folder / "reef.yaml"


def serving_tree(config: ReefConfig) -> dict[str, bytes]:
    """The harness files of what serves now (none for the base)."""
    with ExperienceStore(config.experience_db) as store:
        chain = ReleaseWorkflow(config, store).chain
        head = chain.head("default")
        return files_of(chain.files(head.release_id), "harness") if head else {}


def held_out_rate(config: ReefConfig) -> tuple[float, dict[str, float]]:
    """The held-out tasks under the tree that serves, as a trial tree: never recorded."""
    tree = trial_tree(write_trial(config.state_dir, serving_tree(config)))
    ran = project_episodes(config, "default", HELD_OUT, "native", 1, tree)
    rewards = {episode.task: float(episode.reward or 0.0) for episode in ran}
    return round(statistics.fmean(rewards.values()), 3), rewards


def a_round(config: ReefConfig) -> float:
    """The agent on the suite under what serves, recorded: the experience. Its pass rate."""
    ran = project_episodes(config, "default", SUITE, "native", 1)
    return statistics.fmean(float(episode.passed) for episode in ran)


def run(recipe: str, rounds: int, budget: float, metric_calls: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"reef-harness-episodes-{recipe}-"))
    config = load_config(make_project(folder, recipe))
    started = time.monotonic()
    decisions: list[str] = []
    with reef_serve(folder, free_port()).start() as server:
        before, before_tasks = held_out_rate(config)
        knew = correct(server.url)
        curve = [(0, before)]
        suite_rates = []
        for number in range(rounds):
            with console.status(f"{recipe}: round {number + 1}, the agent on the suite"):
                previous = steps_so_far(server.url)
                suite_rates.append(a_round(config))
            with console.status(f"{recipe}: round {number + 1}, the worker's step"):
                outcomes = next_steps(server.url, previous, 1, budget)
            decisions.append("+".join(outcomes) or "no step")
            spent = metric_calls_so_far(server.url)
            curve.append((spent, held_out_rate(config)[0]))
            console.print(f"{recipe}: round {number + 1}: {decisions[-1]}, {spent} metric calls")
            if not outcomes or spent >= metric_calls:
                break
        after, after_tasks = held_out_rate(config)
        knows = correct(server.url)
        release = httpx.get(f"{server.url}/reef/status").json()["serving"].get("default", "base")
        spent = metric_calls_so_far(server.url)
        listed = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    proposed = [f"{c['id']}: {c['reason']}"[:400] for c in reversed(listed)]
    reasons = step_reasons(folder)
    return {
        "recipe": recipe,
        "before": before,
        "after": after,
        "before_tasks": before_tasks,
        "after_tasks": after_tasks,
        "suite_rates": suite_rates,
        "correct_before": len(knew),
        "correct_after": len(knows),
        "forgot": sorted(set(knew) - set(knows)),
        "release": release,
        "decisions": decisions,
        "reasons": reasons,
        "proposed": proposed,
        "metric_calls": spent,
        "curve": curve,
        "seconds": round(time.monotonic() - started),
    }


def step_reasons(folder: Path) -> list[str]:
    """Why each step ended as it did, from the server's log: its recipe's refusal, or its
    candidate's gate decision."""
    said = ("proposed nothing: ", "default: candidate ")
    lines = [
        line.split(" INFO ", 1)[-1]
        for log in sorted(folder.glob("reef-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if any(part in line for part in said)
    ]
    return [line[:400] for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of traffic, at most")
    parser.add_argument("--budget", type=float, default=900, help="seconds a step may take")
    parser.add_argument("--metric-calls", type=int, default=60, help="the budget of each run")
    parser.add_argument(
        "--preference",
        default="sure",
        help=f"(a): one of {[p.name for p in PREFERENCES]}, or none to run (b) alone",
    )
    args = parser.parse_args()
    recipes = args.recipes.split(",")
    preference = next((p for p in PREFERENCES if p.name == args.preference), None)
    if preference is None and args.preference != "none":
        parser.error(f"--preference: unknown {args.preference!r}")
    on_preference = [
        run_preference(
            preference, recipe, "no_regression", args.rounds, args.budget, "alone", None,
            args.metric_calls,
        )
        for recipe in (recipes if preference else [])
    ]  # fmt: skip
    on_episodes = [run(recipe, args.rounds, args.budget, args.metric_calls) for recipe in recipes]
    if on_preference:
        show(on_preference, f"(a) Harness recipes on the preference {args.preference!r}")
    show(on_episodes, "(b) Harness recipes on the episode suite, SmolLM2-135M, native agent")
    show_reasons(on_episodes)
    OUT.mkdir(exist_ok=True)
    figures = {"preference": on_preference, "episodes": on_episodes}
    (OUT / "harness-episodes.json").write_text(json.dumps(figures, indent=2))
    drawn = ROOT / "docs" / "harness_episodes_calls.png"
    draw(on_preference, on_episodes, drawn, args.metric_calls)


def show(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    columns = ("recipe", "held-out", "correctness", "metric calls", "steps", "release", "run, s")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["recipe"],
            f"{row['before']:.2f} -> {row['after']:.2f}",
            f"{row['correct_before']} -> {row['correct_after']}",
            str(row["metric_calls"]),
            ", ".join(row["decisions"]),
            row["release"],
            str(row["seconds"]),
        )
    console.print(table)


def show_reasons(rows: list[dict[str, Any]]) -> None:
    """Why each step ended as it did: the candidates' reasons and the steps' decisions."""
    for row in rows:
        for reason in [*row["proposed"], *row["reasons"]]:
            console.print(f"[bold]{row['recipe']}[/]: {reason}", soft_wrap=True)


def draw(
    on_preference: list[dict[str, Any]], on_episodes: list[dict[str, Any]], path: Path, budget: int
) -> None:
    """Held-out pass rate against the metric calls spent, one line per recipe, a panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("(b) the episode suite: held-out tasks passed", on_episodes)]
    if on_preference:
        name = on_preference[0]["preference"]
        panels.insert(0, (f"(a) the preference {name!r}: held-out prompts", on_preference))
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for axis, (title, rows) in zip(axes[0], panels, strict=True):
        for row in rows:
            calls, rates = zip(*row["curve"], strict=True)
            axis.plot(calls, rates, marker="o", label=row["recipe"])
        axis.axvline(budget, color="grey", linestyle=":", linewidth=0.8, label="budget")
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("metric calls (answers and episodes scored: search and gate)")
        axis.set_ylabel("pass rate, held out")
        axis.set_ylim(-0.03, 1.05)
        axis.legend(fontsize=7)
    figure.suptitle("The harness recipes on one budget, SmolLM2-135M on 2 CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"drawn: {path}")


if __name__ == "__main__":
    main()
