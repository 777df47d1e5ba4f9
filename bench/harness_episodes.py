"""The four harness recipes on the episode suite, on one budget of metric calls (issue 39, b).

    .venv/bin/python -m bench.harness_episodes [--recipes harness_evolve,gepa,skills,meta_harness]
        [--metric-calls 24] [--rounds 2] [--budget 900]

For each recipe, in a fresh project made by `reef init`: `reef serve` on the embedded
SmolLM2-135M, the episode gate on the shipped suite (`evals/tasks/`, four Harbor tasks, Reef's
native agent in bubblewrap, `policy: no_regression`), and the recipe configured as
docs/recipes.md shows it. `gepa`, `skills` and `meta_harness` search with `episodes` set: every
tree they try is scored by the agent's episodes under it on the same suite (one metric call an
episode); `harness_evolve` learns as it always does, from the agent's recorded calls and the
reports the tests wrote on them. Round by round, the agent runs the suite under what serves
(those episodes are the experience: recorded, each test's reward a report on its calls), then
the worker steps; rounds go on, up to `--rounds`, until the steps have spent `--metric-calls`
(the search's episodes, the gate's episodes and chat answers, as `/reef/status` counts them).

Held out: four tasks of the same kinds on other files and words (`bench/episode_tasks/`), run
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

from bench.preferences import metric_calls_so_far, next_steps, steps_so_far
from bench.results import OUT
from reef.artifacts import files_of
from reef.config import ReefConfig, load_config
from reef.episodes.project import project_episodes
from reef.episodes.tokens import trial_tree
from reef.inference.trials import write_trial
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import free_port, reef_serve
from reef.testing.scripted_user import correct

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "evals" / "tasks"
HELD_OUT = ROOT / "bench" / "episode_tasks"
RECIPES = ["harness_evolve", "gepa", "skills", "meta_harness"]
# Each recipe as docs/recipes.md shows it, with a step's own budget sized to the suite's four
# tasks (a gate of 8 episodes comes on top of every step that proposes).
SETTINGS: dict[str, dict[str, Any]] = {
    "harness_evolve": {"proposer": "hindsight", "batch_size": 4},
    "gepa": {
        "batch_size": 4,
        "episodes": {},
        "pareto_size": 4,
        "minibatch_size": 2,
        "max_metric_calls": 12,
    },
    "skills": {"batch_size": 4, "episodes": {}},
    "meta_harness": {"batch_size": 4, "episodes": {}, "max_nodes": 2},
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
        f"  episodes:\n    tasks: {SUITE}\n    agent: native\n    repeats: 1\n"
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
    reasons: list[str] = []
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
            reasons.append(last_reason(server.url, recipe))
            spent = metric_calls_so_far(server.url)
            curve.append((spent, held_out_rate(config)[0]))
            console.print(f"{recipe}: round {number + 1}: {decisions[-1]}, {spent} metric calls")
            if not outcomes or spent >= metric_calls:
                break
        after, after_tasks = held_out_rate(config)
        knows = correct(server.url)
        release = httpx.get(f"{server.url}/reef/status").json()["serving"].get("default", "base")
        spent = metric_calls_so_far(server.url)
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
        "metric_calls": spent,
        "curve": curve,
        "seconds": round(time.monotonic() - started),
    }


def last_reason(url: str, recipe: str) -> str:
    """Why the recipe's last step ended as it did: its candidate's gate decision, or what the
    step said (a refusal's reason)."""
    status = httpx.get(f"{url}/reef/status").json()["learning"]["scenarios"].get("default", {})
    step = status.get("recipes", {}).get(recipe, {}).get("last_step") or {}
    if step.get("candidate_id"):
        listed = httpx.get(f"{url}/reef/scenarios/default/candidates").json()["data"]
        found = next((c for c in listed if c["id"] == step["candidate_id"]), {})
        return f"{found.get('state')}: {found.get('reason')}; {found.get('decision')}"[:400]
    return f"{step.get('outcome')}: {step.get('error') or ''}"[:400]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--rounds", type=int, default=2, help="rounds of traffic, at most")
    parser.add_argument("--budget", type=float, default=900, help="seconds a step may take")
    parser.add_argument("--metric-calls", type=int, default=24, help="the budget of each run")
    args = parser.parse_args()
    rows = [
        run(recipe, args.rounds, args.budget, args.metric_calls)
        for recipe in args.recipes.split(",")
    ]
    show(rows)
    OUT.mkdir(exist_ok=True)
    (OUT / "harness-episodes.json").write_text(json.dumps(rows, indent=2))
    draw(rows, ROOT / "docs" / "harness_episodes_calls.png", args.metric_calls)


def show(rows: list[dict[str, Any]]) -> None:
    table = Table(title="Harness recipes on the episode suite, SmolLM2-135M, native agent")
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
    for row in rows:
        for reason in row["reasons"]:
            console.print(f"[bold]{row['recipe']}[/]: {reason}", soft_wrap=True)


def draw(rows: list[dict[str, Any]], path: Path, budget: int) -> None:
    """The held-out pass rate against the metric calls spent, one line per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for row in rows:
        calls, rates = zip(*row["curve"], strict=True)
        axes.plot(calls, rates, marker="o", label=row["recipe"])
    axes.axvline(budget, color="grey", linestyle=":", linewidth=0.8, label="budget")
    axes.set_xlabel("metric calls (episodes and answers scored by the steps: search and gate)")
    axes.set_ylabel("held-out tasks passed")
    axes.set_ylim(-0.03, 1.05)
    axes.legend(fontsize=7)
    figure.suptitle("Harness recipes on agent episodes, SmolLM2-135M on 2 CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"drawn: {path}")


if __name__ == "__main__":
    main()
