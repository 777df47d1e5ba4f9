"""Does harness evolution learn a user's preference from feedback? A learning curve on a CPU.

A scripted user wants every answer to end with the line "Cheers, Reef", which the embedded
SmolLM2-135M never writes by itself. Round after round, the user asks a few questions through
`reef serve`, scores each answer (1 with the sign-off, 0 without) and says what it wants. Between
rounds the harness_evolve recipe takes one learning step (its candidate must pass the gate on
separate eval prompts), and the server follows the release head. After each round the held-out
prompts, never used for training or evaluation, measure the pass rate.

The baseline is round 0: the base model on the same held-out prompts, in the same run. It runs
once with the hindsight proposer (the served model answers the failing prompts again with the
feedback beside them; answers that meet the scorer become worked examples) and once with the LLM
proposer (the served model itself reflecting on the failures), and draws both curves into
bench/out/learning_curve.png.

    .venv/bin/pip install -e '.[bench]' && .venv/bin/python -m bench.learning.learning_curve
    [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.common.results import OUT
from reef.config import load_config
from reef.inference.model import ServerModel
from reef.inference.server_file import find_running_server
from reef.learning.plans import LoadedPlan
from reef.learning.worker import LearningWorker
from reef.sdk.recipe import load_recipe
from reef.store import ExperienceStore
from reef.testing.processes import free_port, reef_serve

SIGN_OFF = "Cheers, Reef"
FEEDBACK = f"End every answer with the line: {SIGN_OFF}"
PATTERN = rf"{SIGN_OFF}\s*$"
TRAINING = [
    "What is the capital of France?",
    "Name an animal.",
    "What is 2+2?",
    "Name a day of the week.",
    "What is water made of?",
    "Name a musical instrument.",
    "What is the opposite of hot?",
    "Name a month.",
    "What do bees make?",
    "What is the largest ocean?",
    "Name a vegetable.",
    "What is 10 minus 3?",
]
EVALS = ["What colour is grass?", "Name a planet.", "What is 3+3?", "Name a tree."]
HELD_OUT = [
    "What is the capital of Italy?",
    "Name a fruit.",
    "What is 5+5?",
    "Name a colour.",
    "What is ice?",
    "Name a sport.",
]
console = Console()


def project(folder: Path, proposer: str) -> Path:
    (folder / "evals").mkdir(parents=True)
    (folder / "evals/default.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "messages": [{"role": "user", "content": p}],
                    "scorer": {"type": "regex", "pattern": PATTERN},
                }
            )
            + "\n"
            for p in EVALS
        )
    )
    (folder / "reef.yaml").write_text(
        f"state_dir: {folder}/.reef\nevals_dir: {folder}/evals\n"
        "engine:\n  llamacpp: {n_ctx: 2048, n_threads: 2}\n"
        "gate:\n  policy: improve\n  max_tokens: 48\n"
        # manual: the server's own worker waits for instructions; this script steps itself.
        f"learning:\n  recipe: harness_evolve\n  mode: manual\n  proposer: {proposer}\n"
        "  batch_size: 2\n"
        f"  scorer: {{type: regex, pattern: '{PATTERN}'}}\n"
    )
    return folder / "reef.yaml"


def ask(url: str, prompt: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response


def passes(response: httpx.Response) -> bool:
    return re.search(PATTERN, response.json()["choices"][0]["message"]["content"]) is not None


def held_out_pass_rate(url: str) -> float:
    return sum(passes(ask(url, p)) for p in HELD_OUT) / len(HELD_OUT)


def serving(url: str) -> str:
    return str(httpx.get(f"{url}/reef/status").json()["serving"].get("default", "base"))


async def curve(proposer: str, rounds: int, per_round: int) -> list[dict]:
    config_path = project(Path(tempfile.mkdtemp(prefix=f"reef-curve-{proposer}-")), proposer)
    config = load_config(config_path, env={})
    points = []
    with reef_serve(config_path.parent, free_port()).start() as server:
        store = ExperienceStore(config.experience_db)
        running = find_running_server(config.state_dir)
        assert running is not None, "the server did not advertise itself"
        model = ServerModel(running.url, running.token)  # one model: the server's
        recipe = load_recipe("harness_evolve", config.learning.recipe_settings())
        plan = LoadedPlan("default", config.learning.mode, [recipe])
        worker = LearningWorker(config, store, model, plans=[plan])
        feedback = 0
        points.append(
            {
                "round": 0,
                "feedback": 0,
                "held_out": held_out_pass_rate(server.url),
                "release": "base",
                "step": "-",
            }
        )
        try:
            for n in range(1, rounds + 1):
                prompts = [TRAINING[(n * per_round + i) % len(TRAINING)] for i in range(per_round)]
                for prompt in prompts:  # the scripted user
                    response = ask(server.url, prompt)
                    good = passes(response)
                    report = {
                        "references": [response.headers["x-reef-agent-record-id"]],
                        "score": float(good),
                        **({} if good else {"feedback": FEEDBACK}),
                    }
                    httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
                    feedback += 1
                result = await worker.step("default")
                head = worker.workflow.chain.head("default")
                deadline = time.monotonic() + 5
                while (
                    head and serving(server.url) != head.release_id and time.monotonic() < deadline
                ):
                    time.sleep(0.1)
                points.append(
                    {
                        "round": n,
                        "feedback": feedback,
                        "held_out": held_out_pass_rate(server.url),
                        "release": serving(server.url),
                        "step": result.outcome,
                    }
                )
                console.print(f"{proposer} round {n}: {points[-1]}", highlight=False)
        finally:
            await model.close()
            store.close()
    return points


def draw(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for proposer, points in curves.items():
        axis.plot(
            [p["feedback"] for p in points],
            [p["held_out"] for p in points],
            marker="o",
            label=f"harness_evolve, {proposer} proposer",
        )
    axis.set_xlabel("feedback reports received")
    axis.set_ylabel("held-out answers ending with the sign-off")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title("Learning a user's preference from feedback (SmolLM2-135M, CPU)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=3)
    args = parser.parse_args()
    curves = {p: asyncio.run(curve(p, args.rounds, args.per_round)) for p in ("hindsight", "llm")}
    table = Table(title="held-out pass rate (answers ending with the sign-off)")
    for column in ("proposer", "before (base)", "after", "change", "releases", "steps"):
        table.add_column(column)
    for proposer, points in curves.items():
        before, after = points[0]["held_out"], points[-1]["held_out"]
        steps = ", ".join(p["step"] for p in points[1:])
        table.add_row(
            proposer,
            f"{before:.2f}",
            f"{after:.2f}",
            f"{after - before:+.2f}",
            points[-1]["release"],
            steps,
        )
    console.print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / "learning_curve.json").write_text(json.dumps(curves, indent=2))
    draw(curves, OUT / "learning_curve.png")
    console.print(f"curve drawn in {OUT / 'learning_curve.png'}")


if __name__ == "__main__":
    main()
