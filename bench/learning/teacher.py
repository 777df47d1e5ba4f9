"""A teacher the student learns from: the share of calls that need the teacher, round after round,
as `sft` trains the embedded model on the teacher's answers (issue 21).

`reef serve` on the embedded SmolLM2-135M with a teacher: an OpenAI-compatible upstream this
bench starts, which answers every question as the user wants ("Sure! " and a short answer). The
scenario's check is the user's: an answer must start with "Sure" (`teacher.scorer`), which the
student never does by itself. A call whose student answer fails goes to the teacher, and the
teacher's answer, recorded as a demonstration, is what `sft` learns from between rounds (the gate
releases whatever it trains: floor 0, as in tests/e2e/learning/test_sft_loop.py).

Each round the user asks the training prompts (recorded, so learned from) and the held-out ones
(`x-reef-capture: false`: never recorded, never learned from); the teacher's share of each is
counted from the responses' `x-reef-arm`. Round 0, before any learning, is the baseline. The
curve goes to docs/teacher_share.png, the figures to bench/out/teacher.json.

    .venv/bin/python -m bench.learning.teacher [--rounds 3] [--budget 600]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bench.common.results import OUT
from reef.testing import scripted_user
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.threaded import chat_upstream

PATTERN = r"^\W*Sure"
ANSWERS = {
    "What is the capital of France?": "Paris.",
    "Name an animal.": "A horse.",
    "What is 2+2?": "4.",
    "What colour is the sky?": "Blue.",
    "Name a fruit.": "An apple.",
    "What is the largest ocean?": "The Pacific.",
}
console = Console()


async def teacher_answers(request: Request) -> Response:
    """A teacher that answers as the user wants: "Sure! " and a short answer."""
    body = await request.json()
    question = body["messages"][-1]["content"]
    text = f"Sure! {ANSWERS.get(question, 'Here is my answer.')}"
    return JSONResponse(
        {
            "id": "chatcmpl-teacher",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "teacher",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=600, help="seconds a round may learn")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="reef-bench-teacher-"))
    (project / "evals").mkdir()
    (project / "evals" / "default.jsonl").write_text(
        scripted_user.eval_tasks(scripted_user.EVALS, PATTERN)
    )
    rounds = []
    with chat_upstream(teacher_answers, "teacher", "the teacher") as teacher_url:
        (project / "reef.yaml").write_text(config(teacher_url))
        with reef_serve(project, free_port()).start() as server:
            for number in range(args.rounds + 1):
                rounds.append(one_round(server, number))
                console.print(rounds[-1])
                if number < args.rounds:
                    learned = scripted_user.decided(server.url, number, args.budget)
                    console.print(
                        f"round {number}: {learned.get('state', 'no step')}: "
                        f"{learned.get('decision', '')}"
                    )
                    wait_for_serving(server, learned.get("release_id"))
            costs = httpx.get(server.url + "/reef/status").json()["teachers"]["default"]
    report(rounds, costs)


def config(teacher_url: str) -> str:
    return (
        "engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n"
        "gate:\n  policy: floor\n  floor: 0.0\n  max_tokens: 24\n"
        "learning:\n  recipe: sft\n  interval_s: 0.5\n  batch_size: 4\n  steps: 30\n"
        f"  scorer: {{type: regex, pattern: '{PATTERN}'}}\n"
        f"teacher:\n  url: {teacher_url}\n  scorer: {{type: regex, pattern: '{PATTERN}'}}\n"
    )


def one_round(server: ServerProcess, number: int) -> dict:
    def taught(prompts: list[str], capture: bool) -> int:
        return sum(
            scripted_user.ask(server.url, p, max_tokens=24, capture=capture).headers.get(
                "x-reef-arm"
            )
            == "teacher"
            for p in prompts
        )

    training = taught(scripted_user.TRAINING, capture=True)
    held_out = taught(scripted_user.HELD_OUT, capture=False)
    serving = httpx.get(server.url + "/reef/status").json()["serving"].get("default", "base")
    return {
        "round": number,
        "serving": serving,
        "training_taught": training,
        "training_calls": len(scripted_user.TRAINING),
        "held_out_taught": held_out,
        "held_out_calls": len(scripted_user.HELD_OUT),
    }


def wait_for_serving(server: ServerProcess, release_id: str | None, timeout_s: float = 30) -> None:
    if not release_id:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(server.url + "/reef/status").json()["serving"].get("default") == release_id:
            return
        time.sleep(0.2)


def report(rounds: list[dict], costs: dict) -> None:
    table = Table(title="calls the teacher answered, round by round (round 0: before learning)")
    for column in ("round", "serving", "training prompts", "held-out prompts"):
        table.add_column(column, justify="right")
    for r in rounds:
        table.add_row(
            str(r["round"]),
            r["serving"],
            f"{r['training_taught']}/{r['training_calls']}",
            f"{r['held_out_taught']}/{r['held_out_calls']}",
        )
    console.print(table)
    console.print(
        f"teacher cost: {costs['calls']} calls {costs['by_reason']}, {costs['prompt_tokens']} "
        f"prompt and {costs['completion_tokens']} completion tokens, {costs['failures']} failures"
    )
    first, last = rounds[0], rounds[-1]
    verdict = "PASS" if share(last) < share(first) else "MISS"
    console.print(
        f"target: the teacher's share falls as the student learns -> {share(first):.0%} in round "
        f"0, {share(last):.0%} in round {last['round']}: {verdict}"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "teacher.json").write_text(json.dumps({"rounds": rounds, "costs": costs}, indent=2))
    draw(rounds, Path(__file__).resolve().parents[2] / "docs" / "teacher_share.png")


def share(r: dict) -> float:
    """The teacher's share of a round's calls, training and held-out together."""
    return (r["training_taught"] + r["held_out_taught"]) / (
        r["training_calls"] + r["held_out_calls"]
    )


def draw(rounds: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(6, 3.6))
    numbers = [r["round"] for r in rounds]
    lines = (
        ("training", "training prompts (learned from)", "o", "-"),
        ("held_out", "held-out prompts (never learned from)", "s", "--"),
    )
    for key, label, marker, style in lines:
        ax.plot(
            numbers,
            [r[f"{key}_taught"] / r[f"{key}_calls"] for r in rounds],
            marker=marker,
            linestyle=style,
            label=label,
        )
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(numbers)
    ax.set_xlabel("round (sft trains on the teacher's answers between rounds)")
    ax.set_ylabel("share of calls the teacher answered")
    ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    console.print(f"drawn: {path}")


if __name__ == "__main__":
    main()
