"""self_play for a fixed budget on the embedded model (issue 39): what the designer proposed, how
hard its tasks were for the agent, and the agent's solve rate on held-out tasks of the same
kinds before and after.

The served SmolLM2-135M is both the designer (its task lists constrained by the design schema)
and the agent. Each round is one learning step of the real worker: design, sampled attempts,
checking programs, and the gate (`no_regression` on the round's edge tasks at temperature 0)
deciding the candidate. The held-out tasks are drawn by a seeded program (`held_out`), never
designed, and answered at temperature 0 under the base tree and under the last release.

    .venv/bin/python -m bench.learning.self_play [--rounds 4] [--tasks 6] [--attempts 4]
        [--held-out 24]

Figures go to bench/out/self_play.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common.results import OUT
from reef.config import load_config
from reef.engines.llamacpp import LlamaCppEngine
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel, answer_text
from reef.learning.worker import LearningWorker
from reef.protocol import ChatRequest
from reef.recipes.self_play.tasks import KINDS, Task, held_out
from reef.store import ExperienceStore

console = Console(width=120)


async def solve_rate(model: LocalModel, binding: Binding, tasks: list[Task]) -> float:
    solved = 0
    for task in tasks:
        body = {"messages": [{"role": "user", "content": task.prompt}], "temperature": 0,
                "max_tokens": 24}  # fmt: skip
        completion = await model.complete(ChatRequest.model_validate(body), binding)
        solved += task.solved_by(answer_text(completion))
    return solved / len(tasks)


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    (folder / "reef.yaml").write_text(
        f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\n"
        "engine:\n  llamacpp:\n    n_ctx: 2048\n    n_threads: 2\n"
        "gate:\n  policy: no_regression\n  min_tasks: 0\n"
        f"learning:\n  recipe: self_play\n  every_s: 0\n  tasks_per_round: {args.tasks}\n"
        f"  attempts: {args.attempts}\n"
    )
    config = load_config(folder / "reef.yaml", env={})
    engine = LlamaCppEngine(n_ctx=2048, n_threads=2)
    await engine.start()
    model = LocalModel(engine)
    held = held_out(KINDS, args.held_out, seed=7)
    rounds: list[dict[str, Any]] = []
    try:
        with ExperienceStore(config.experience_db) as store:
            worker = LearningWorker(config, store, model)
            before = await solve_rate(model, BASE_BINDING, held)
            for number in range(args.rounds):
                started = time.perf_counter()
                result = await worker.step("default")
                candidate = (
                    worker.workflow.candidates.get(result.candidate_id)
                    if result.candidate_id else None
                )  # fmt: skip
                rounds.append({
                    "round": number + 1,
                    "outcome": result.outcome,
                    "detail": result.detail[:160],
                    "metrics": (candidate.metrics or {}) if candidate else {},
                    "seconds": time.perf_counter() - started,
                })  # fmt: skip
            head = worker.workflow.chain.head("default")
            after = await solve_rate(model, worker.workflow.binding(head), held)
            designer = worker.lanes["default"].learners[0].recipe.designer  # type: ignore[attr-defined]
    finally:
        await engine.close()
    return {
        "held_out": {"tasks": len(held), "before": before, "after": after},
        "release": head.release_id if head else None,
        "rounds": rounds,
        "designed": [{"prompt": p, "solve_rate": r} for p, r in designer.past],
    }


def show(result: dict[str, Any]) -> None:
    table = Table(title="self_play rounds (the served model designs and attempts)")
    for column in ("round", "outcome", "designed", "checkable", "solve rates", "reward", "s"):
        table.add_column(column)
    for row in result["rounds"]:
        metrics = row["metrics"]
        table.add_row(
            str(row["round"]),
            row["outcome"] if metrics else f"{row['outcome']}: {row['detail'][:50]}",
            str(metrics.get("designed", "-")),
            str(metrics.get("checkable", "-")),
            str(metrics.get("solve_rates", "-")),
            f"{metrics['designer_reward']:.2f}" if "designer_reward" in metrics else "-",
            f"{row['seconds']:.0f}",
        )
    console.print(table)
    rates = [task["solve_rate"] for task in result["designed"]]
    edge = sum(0 < rate < 1 for rate in rates)
    console.print(
        f"designed tasks: {len(rates)} checkable, {edge} at the edge, "
        f"{sum(rate == 1 for rate in rates)} always solved, "
        f"{sum(rate == 0 for rate in rates)} never"
    )
    held = result["held_out"]
    console.print(
        f"held-out solve rate ({held['tasks']} tasks, temperature 0): base {held['before']:.2f} "
        f"-> {result['release'] or 'no release'} {held['after']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-self-play-") as folder:
        result = asyncio.run(run(args, Path(folder)))
    show(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "self_play.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
