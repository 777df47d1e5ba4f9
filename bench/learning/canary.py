"""Canaries on live traffic: a harness that breaks answers passes the offline gate and is rolled
back by its canary; a good one is promoted (issue 21).

`reef serve` on the embedded SmolLM2-135M with the gate policy `canary`: a candidate must reach
the floor on the offline eval tasks (which only ask for an answer, as a careless suite does),
then serves `--share` percent of sessions while a scripted user asks factual questions, one
session per question, and reports 1 when the answer holds the expected word, else 0. The server
judges the canary on those reports (`reef.releases.canary`) and promotes it or rolls it back by
itself. Two runs in one process, each against the base model as the stable arm:

- **worse**: a harness whose examples answer every question "I cannot say." (passes the offline
  tasks, fails the users);
- **better**: a harness asking for one short sentence, with three worked examples.

The baseline is the stable arm of the same canary, over the same period. The bench prints each
run's decision, the reports and mean score of each arm, the share of sessions the canary served,
and the time to decide; it draws the running estimate and its interval (`docs/canary.png`).

    .venv/bin/python -m bench.learning.canary [--share 20] [--min-reports 15]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.common.results import OUT
from reef.config import CanaryConfig
from reef.releases.canary import judge
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef

QUESTIONS = [
    ("What is the capital of France?", "paris"),
    ("What is 2+2?", "4|four"),
    ("What colour is the sky on a clear day?", "blue"),
    ("How many days are in a week?", "7|seven"),
    ("What is frozen water called?", "ice"),
    ("What do bees make?", "honey"),
    ("What is the opposite of hot?", "cold"),
    ("What planet do we live on?", "earth"),
    ("What colour is grass?", "green"),
    ("How many legs does a dog have?", "4|four"),
    ("What is the capital of Italy?", "rome"),
    ("What animal says moo?", "cow"),
    ("What is the largest ocean?", "pacific"),
    ("What do you call a baby cat?", "kitten"),
    ("What is 10 minus 3?", "7|seven"),
    ("Which season comes after winter?", "spring"),
]
WORSE = {
    "AGENTS.md": "Never answer a question. Reply only: I cannot say.\n",
    "examples.jsonl": "".join(
        json.dumps({"user": q, "assistant": "I cannot say."}) + "\n"
        for q in ("What is the capital of Spain?", "What is 5+5?", "What colour is snow?")
    ),
}
BETTER = {
    "AGENTS.md": "Answer in one short sentence.\n",
    "examples.jsonl": "".join(
        json.dumps({"user": q, "assistant": a}) + "\n"
        for q, a in (
            ("What is the capital of Spain?", "The capital of Spain is Madrid."),
            ("What is 5+5?", "5+5 is 10."),
            ("What colour is snow?", "Snow is white."),
        )
    ),
}
EVAL_TASK = {"scorer": {"type": "regex", "pattern": "."}}  # any answer passes offline
EVAL_PROMPTS = ["Hello!", "Tell me something.", "Say a word.", "Name a colour.", "Hi", "Ask me."]
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=int, default=20)
    parser.add_argument("--min-reports", type=int, default=15)
    parser.add_argument("--margin", type=float, default=0.25)
    parser.add_argument("--confidence", type=float, default=0.9)
    parser.add_argument("--deadline", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="reef-bench-canary-"))
    (project / "reef.yaml").write_text(
        "engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n"
        "gate:\n  policy: canary\n  floor: 0.5\n  max_tokens: 16\n"
        f"  canary: {{share: {args.share}, min_reports: {args.min_reports}, "
        f"margin: {args.margin}, confidence: {args.confidence}, check_s: 0.5, "
        f"deadline_s: {args.deadline}}}\n"
    )
    (project / "evals").mkdir()
    (project / "evals" / "default.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": p}], **EVAL_TASK}) + "\n"
            for p in EVAL_PROMPTS
        )
    )
    rng = random.Random(args.seed)
    runs = []
    with reef_serve(project, free_port()).start() as server:
        for name, files in (("worse", WORSE), ("better", BETTER)):
            runs.append(
                run_canary(
                    server, project, name, files, rng, args.deadline, args.margin, args.confidence
                )
            )
            if runs[-1]["decision"] == "promote":  # the next canary is against the base again
                rollback_to_base(project)
    report(runs, args)


def run_canary(
    server: ServerProcess,
    project: Path,
    name: str,
    files: dict[str, str],
    rng: random.Random,
    deadline_s: float,
    margin: float,
    confidence: float,
) -> dict:
    folder = project / name
    folder.mkdir()
    for path, text in files.items():
        (folder / path).write_text(text)
    started = time.monotonic()
    published = run_reef(project, "release", "publish", str(folder), "--kind", "harness")
    candidate = candidate_id(published.stdout)
    console.print(f"[bold]{name}[/]: {published.stdout.strip()}")
    canary_release = wait_for_canary(server, candidate)
    arms: dict[str, list[float]] = {"stable": [], "canary": []}
    tracing = CanaryConfig(min_reports=2, margin=margin, confidence=confidence)
    trace: list[dict] = []
    n = 0
    while time.monotonic() - started < deadline_s + 60:
        question, expected = rng.choice(QUESTIONS)
        session = f"{name}-{n}"
        n += 1
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 24,
                "temperature": 0,
            },
            headers={"x-reef-session": session},
            timeout=120,
        )
        answer.raise_for_status()
        arm = answer.headers.get("x-reef-arm")
        if arm is None:  # the canary ended: the head serves without a policy
            break
        text = answer.json()["choices"][0]["message"]["content"] or ""
        score = 1.0 if re.search(rf"\b({expected})\b", text.lower()) else 0.0
        arms[arm].append(score)
        record = answer.headers["x-reef-agent-record-id"]
        httpx.post(
            server.url + "/reef/report", json={"references": [record], "score": score}
        ).raise_for_status()
        # The running estimate as the server computes it, from the first report of each arm
        # (the server acts only once each arm has min_reports).
        running = judge(tracing, arms, age_s=0)
        if running.difference is not None:
            trace.append(
                {"sessions": n, "difference": running.difference, "interval": running.interval}
            )
    decided = candidate_state(project, candidate)
    took = time.monotonic() - started
    action = "promote" if decided["state"] == "released" else "rollback"
    return {
        "run": name,
        "candidate": candidate,
        "canary_release": canary_release,
        "decision": action,
        "why": decided["decision"],
        "sessions": n,
        "canary_sessions": len(arms["canary"]),
        "stable": arms["stable"],
        "canary": arms["canary"],
        "seconds": took,
        "trace": trace,
        "margin": margin,
    }


def candidate_id(output: str) -> str:
    found = re.search(r"candidate (cand_\S+)", output)
    if not found:
        raise SystemExit(f"no candidate in the publish output:\n{output}")
    return found.group(1)


def wait_for_canary(server: ServerProcess, candidate: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = httpx.get(server.url + "/reef/scenarios/default/candidates").json()["data"]
        mine = next(c for c in shown if c["id"] == candidate)
        if mine["state"] == "canary":
            release = mine["release_id"]
            while (
                httpx.get(server.url + "/reef/status").json()["serving"].get("default") != release
            ):
                time.sleep(0.1)
            return release
        if mine["state"] in ("rejected", "released"):
            raise SystemExit(f"{candidate} never went on a canary: {mine['decision']}")
        time.sleep(0.5)
    raise SystemExit(f"{candidate} did not reach a canary in {timeout_s} s")


def candidate_state(project: Path, candidate: str) -> dict:
    shown = json.loads(run_reef(project, "release", "candidates", "--json").stdout)
    return next(c for c in shown if c["id"] == candidate)


def rollback_to_base(project: Path) -> None:
    empty = project / "empty"
    empty.mkdir(exist_ok=True)
    run_reef(project, "release", "publish", str(empty), "--kind", "harness", "--approve")


def mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "-"


def report(runs: list[dict], args: argparse.Namespace) -> None:
    table = Table(
        title=f"canaries on live reports (share {args.share}%, "
        f"min {args.min_reports} reports an arm, margin {args.margin}, "
        f"confidence {args.confidence})"
    )
    for column in (
        "run",
        "decision",
        "stable reports",
        "stable mean (baseline)",
        "canary reports",
        "canary mean",
        "canary share of sessions",
        "seconds",
    ):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            run["run"],
            run["decision"],
            str(len(run["stable"])),
            mean(run["stable"]),
            str(len(run["canary"])),
            mean(run["canary"]),
            f"{run['canary_sessions']}/{run['sessions']} = "
            f"{run['canary_sessions'] / max(1, run['sessions']):.0%}",
            f"{run['seconds']:.0f}",
        )
    console.print(table)
    for run in runs:
        console.print(f"{run['run']}: {run['why']}")
    expected = {"worse": "rollback", "better": "promote"}
    verdict = all(run["decision"] == expected[run["run"]] for run in runs)
    console.print(f"target: worse rolled back, better promoted: {'PASS' if verdict else 'MISS'}")
    OUT.mkdir(exist_ok=True)
    (OUT / "canary.json").write_text(json.dumps(runs, indent=2))
    draw(runs, Path(__file__).resolve().parents[2] / "docs" / "canary.png")


def draw(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        points = run["trace"]
        sessions = [t["sessions"] for t in points]
        ax.plot(sessions, [t["difference"] for t in points], label="canary - stable (mean)")
        ax.fill_between(
            sessions,
            [t["interval"][0] for t in points],
            [t["interval"][1] for t in points],
            alpha=0.25,
            label="interval",
        )
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axhline(-run["margin"], color="red", linewidth=0.8, linestyle="--", label="-margin")
        ax.axvline(run["sessions"], color="black", linewidth=0.8, linestyle=":", label="decided")
        ax.set_title(f"{run['run']} harness on a canary: {run['decision']}")
        ax.set_xlabel("sessions")
        ax.set_ylabel("difference in mean score")
        ax.legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    console.print(f"drawn: {path}")


if __name__ == "__main__":
    main()
