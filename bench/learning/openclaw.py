"""Does a preference said only in the next message get learned? openclaw_rl, round by round.

    .venv/bin/python -m bench.learning.openclaw [--rounds 3] [--sessions 2] [--budget 900]

In a fresh project: `reef serve` on the embedded SmolLM2-135M with `openclaw_rl` (the keyword
judge: the 135M model's own votes are close to noise) and the default `no_regression` gate on
the six correctness tasks `reef init` writes beside eval prompts scored "at most 12 words"
(group `preference`). The baseline is the base model's held-out answers and correctness tasks,
measured in the same run. Each round, a scripted user opens `--sessions` sessions per training
prompt; each answer, sampled at temperature 1, is followed by the user's next message: "No,
shorter: answer in a few words." when it runs over 12 words, thanks otherwise. No score is ever
reported. The worker judges, trains, gates; then the held-out prompts are asked again (greedy)
under whatever serves. It prints, per round, the judged turns, the gate's decision, the held-out
mean length in words and share of short answers, and the correctness tasks passed, and draws
them (`--plot`, default docs/openclaw_rounds.png). Measurements are not recorded: they are not
traffic.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from reef.testing.processes import free_port, reef_serve
from reef.testing.scripted_user import (
    EVALS,
    HELD_OUT,
    SHORT_PATTERN,
    TRAINING,
    converse,
    correct,
    correctness_tasks,
    decided,
    eval_tasks,
    mean_words,
    pass_rate,
)

CONFIG = """engine:
  llamacpp: {n_ctx: 1024, n_threads: 1}
gate:
  max_tokens: 48
learning:
  recipe: openclaw_rl
  judge: keywords
  interval_s: 0.5
  batch_size: BATCH
  steps: 8
  learning_rate: 0.001
"""


def project(folder: Path, batch: int) -> Path:
    (folder / "evals").mkdir(parents=True)
    preference = eval_tasks(EVALS, SHORT_PATTERN, group="preference")
    (folder / "evals/default.jsonl").write_text(correctness_tasks() + preference)
    (folder / "reef.yaml").write_text(CONFIG.replace("BATCH", str(batch)))
    return folder


def held_out(url: str) -> tuple[float, float, int]:
    """Mean words and share of short answers on the held-out prompts; correctness tasks."""
    short = pass_rate(url, HELD_OUT, SHORT_PATTERN, max_tokens=48, capture=False)
    return mean_words(url, HELD_OUT, capture=False), short, len(correct(url, 48))


def run(rounds: int, sessions: int, budget: float) -> list[dict]:
    batch = len(TRAINING) * sessions
    folder = project(Path(tempfile.mkdtemp(prefix="reef-openclaw-")), batch)
    rows = []
    with reef_serve(folder, free_port()).start() as server:
        words, short, right = held_out(server.url)
        rows.append(
            {"round": 0, "words": words, "short": short, "correct": right, "decision": "base"}
        )
        print(
            f"round 0 (base): held-out {words:.1f} words, {short:.0%} short; {right} of 6 "
            "correctness tasks",
            flush=True,
        )
        for number in range(1, rounds + 1):
            replies = [
                converse(server.url, prompt, session=f"r{number}-{prompt}-{copy}")[1]
                for prompt in TRAINING
                for copy in range(sessions)
            ]
            corrected = sum(reply.startswith("No") for reply in replies)
            candidate = decided(server.url, number - 1, budget)
            words, short, right = held_out(server.url)
            state = candidate.get("state", "none in budget")
            rows.append(
                {
                    "round": number,
                    "words": words,
                    "short": short,
                    "correct": right,
                    "decision": state,
                }
            )
            print(
                f"round {number}: {len(replies)} sessions, {corrected} corrected; candidate "
                f"{state} ({candidate.get('decision', '')}); held-out {words:.1f} words, "
                f"{short:.0%} short; {right} of 6 correctness tasks",
                flush=True,
            )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    rounds = [row["round"] for row in rows]
    axes.plot(rounds, [row["words"] for row in rows], marker="o", label="held-out mean words")
    axes.axhline(rows[0]["words"], linestyle="--", color="grey", label="base (same run)")
    for row in rows[1:]:
        axes.annotate(row["decision"], (row["round"], row["words"]), fontsize=8)
    axes.set(xlabel="round", ylabel="words per answer", title="openclaw_rl: 'No, shorter'")
    axes.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=2, help="sessions per training prompt")
    parser.add_argument("--budget", type=float, default=900, help="seconds to wait per round")
    parser.add_argument("--plot", type=Path, default=Path("docs/openclaw_rounds.png"))
    arguments = parser.parse_args()
    rows = run(arguments.rounds, arguments.sessions, arguments.budget)
    base, last = rows[0], rows[-1]
    print(
        f"held-out mean words {base['words']:.1f} (base) -> {last['words']:.1f} "
        f"({last['words'] / base['words']:.2f}x); short answers {base['short']:.0%} -> "
        f"{last['short']:.0%}; correctness tasks {base['correct']} -> {last['correct']} of 6"
    )
    plot(rows, arguments.plot)
    print(f"drawn: {arguments.plot}")


if __name__ == "__main__":
    main()
