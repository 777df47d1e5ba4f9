"""The episode gate against the chat-answer gate, on the same two harness candidates (issue 38).

`reef serve` on the embedded SmolLM2-135M, in a project made by `reef init` (its six chat eval
tasks), with `gate.episodes` set to the shipped Harbor suite (`evals/tasks/`, four tasks) and
Reef's native agent in bubblewrap. Two harness candidates, one after the other:

- **helps**: a rule and three worked examples showing the agent acting through a fenced `sh`
  block (the form the native agent runs when a model answers in text, as this one does), on
  other files and words than the suite's;
- **breaks**, proposed once the helper is released (so judged against it): the rule turned
  into "describe in prose, never run a command", the same examples answered in prose.

Each is judged twice: by the episode gate (the agent runs every task `--repeats` times on each
tree, paired) and, as a dry run that publishes nothing, by the chat-answer gate on the same
server (`ReleaseWorkflow.judge` with `gate.episodes` unset). The base tree's pass rate is the
first episode gate's current side. Figures go to bench/out/episodes.json.

    .venv/bin/python -m bench.learning.episodes [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common.results import OUT
from reef.config import ReefConfig, load_config
from reef.evaluation.runner import model_generate
from reef.inference.model import open_model
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.testing.processes import free_port, reef_serve, serving_everywhere

SUITE = Path(__file__).resolve().parents[2] / "evals" / "tasks"
TOKEN = "bench-episodes-token"
console = Console(width=130)  # the table has a column per task

HELPS_RULE = (
    "Act, do not explain: answer with one fenced ```sh block holding the shell command that "
    "does the task, and nothing else. When the output comes back, answer `Done.`"
)
HELPS_EXAMPLES = [
    (
        "Write the word `pearl` (and nothing else) to the file `/app/out.txt`.",
        "```sh\necho pearl > /app/out.txt\n```",
    ),
    (
        "Count the lines of `/app/list.txt` and write the count (just the number) to `/app/n.txt`.",
        "```sh\nwc -l < /app/list.txt > /app/n.txt\n```",
    ),
    (
        "The file `/app/pair.txt` holds two integers, one per line. Use the shell to add them "
        "and write their sum (just the number) to `/app/total.txt`.",
        "```sh\npaste -sd+ /app/pair.txt | bc > /app/total.txt\n```",
    ),
    ('Output:\n{"exit_code": 0, "output": ""}', "Done."),
]
BREAKS_RULE = (
    "Never run a command and never write a code block: describe in one plain sentence what "
    "should be done."
)
BREAKS_EXAMPLES = [
    (user, f"I would {verb}.")
    for (user, _), verb in zip(
        HELPS_EXAMPLES[:3],
        [
            "write the word pearl into /app/out.txt",
            "count the lines of /app/list.txt and write the number into /app/n.txt",
            "add the two numbers of /app/pair.txt and write the sum into /app/total.txt",
        ],
        strict=True,
    )
]


def tree(rule: str, examples: list[tuple[str, str]]) -> dict[str, bytes]:
    lines = [json.dumps({"user": user, "assistant": assistant}) for user, assistant in examples]
    return {"rules/act.md": rule.encode(), "examples.jsonl": "\n".join(lines).encode()}


def make_project(folder: Path, repeats: int) -> Path:
    subprocess.run(
        [sys.executable, "-m", "reef", "init"], cwd=folder, check=True, capture_output=True
    )
    (folder / "reef.yaml").write_text(
        "gate:\n  policy: no_regression\n"
        f"  episodes:\n    tasks: {SUITE}\n    agent: native\n    repeats: {repeats}\n"
        "episodes:\n  wall_time_s: 180\n  max_steps: 4\n"
    )
    return folder / "reef.yaml"


def chat_only(config: ReefConfig) -> ReefConfig:
    chat = config.model_copy(deep=True)
    chat.gate.episodes = None
    return chat


def pass_rate(evaluation: dict[str, Any], side: str) -> dict[str, float]:
    return {
        r["task_id"].removeprefix("episode:"): r[f"{side}_score"] for r in evaluation["results"]
    }


async def judge_both(
    config: ReefConfig, store: ExperienceStore, name: str, files: dict[str, bytes]
) -> dict[str, Any]:
    workflow, chat = ReleaseWorkflow(config, store), ReleaseWorkflow(chat_only(config), store)
    candidate = workflow.propose("default", "harness", files, reason=name)
    async with open_model(config) as model:
        generate = model_generate(model, workflow.eval_settings("default"))
        with console.status(f"{name}: the chat-answer gate (a dry run)"):
            chat_outcome, chat_why, chat_report = await chat.judge(candidate, generate)
        with console.status(f"{name}: the episode gate (the native agent on {SUITE.name}/)"):
            gated = await workflow.gate(candidate, generate)
    assert chat_report is not None and gated.evaluation is not None
    return {
        "candidate": gated.id,
        "episode_gate": gated.state,
        "episode_decision": gated.decision,
        "current_pass": pass_rate(gated.evaluation, "current"),
        "candidate_pass": pass_rate(gated.evaluation, "candidate"),
        "chat_gate": chat_outcome,
        "chat_decision": chat_why,
        "chat_current_mean": round(chat_report.current_mean, 3),
        "chat_candidate_mean": round(chat_report.candidate_mean, 3),
        "release_id": gated.release_id,
    }


def mean(rates: dict[str, float]) -> float:
    return round(sum(rates.values()) / len(rates), 3) if rates else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="episodes per task and tree")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-bench-episodes-") as folder:
        path = make_project(Path(folder), args.repeats)
        config = load_config(path, env={"REEF_TOKEN": TOKEN})
        server = reef_serve(Path(folder), free_port(), env={"REEF_TOKEN": TOKEN})
        with server.start(), ExperienceStore(config.experience_db) as store:
            helps = asyncio.run(
                judge_both(config, store, "helps", tree(HELPS_RULE, HELPS_EXAMPLES))
            )
            if helps["release_id"]:
                serving_everywhere([server], helps["release_id"], TOKEN)
            breaks = asyncio.run(
                judge_both(config, store, "breaks", tree(BREAKS_RULE, BREAKS_EXAMPLES))
            )
    show(helps, breaks, args.repeats)


def show(helps: dict[str, Any], breaks: dict[str, Any], repeats: int) -> None:
    rows = [
        ("base", helps["current_pass"], "", "", helps["chat_current_mean"]),
        ("helps", helps["candidate_pass"], helps["episode_gate"], helps["chat_gate"],
         helps["chat_candidate_mean"]),
        ("breaks", breaks["candidate_pass"], breaks["episode_gate"], breaks["chat_gate"],
         breaks["chat_candidate_mean"]),
    ]  # fmt: skip
    tasks = list(helps["current_pass"])
    table = Table(title=f"The episode gate and the chat-answer gate ({repeats} per task, tree)")
    for column in ("tree", "episodes passed", *tasks, "episode gate", "chat gate", "chat mean"):
        table.add_column(column)
    for name, rates, episode_gate, chat_gate, chat_mean in rows:
        scores = [f"{rates.get(task, 0.0):g}" for task in tasks]
        table.add_row(
            name, f"{mean(rates):.2f}", *scores, episode_gate, chat_gate, f"{chat_mean:.2f}"
        )
    console.print(table)
    for name, result in (("helps", helps), ("breaks", breaks)):
        console.print(
            f"[bold]{name}[/]: episode gate: {result['episode_decision']}", soft_wrap=True
        )
        console.print(f"  chat-answer gate: {result['chat_decision']}", soft_wrap=True)
    OUT.mkdir(exist_ok=True)
    figures = {"repeats": repeats, "helps": helps, "breaks": breaks}
    (OUT / "episodes.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
