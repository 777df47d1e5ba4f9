"""SAO against its GRPO control: the mean reward over scored rollouts, from the same base.

    .venv/bin/python -m bench.learning.sao [--rollouts 48] [--group 4]
        [--arms sao,sao_grpo,sao_old_defaults,sft]

Each arm is a fresh `reef serve` on the embedded SmolLM2-135M with its recipe (`sao`: one scored
rollout per optimiser step, a critic for the baseline; `sao_grpo`: the same loss, a step per
group of `--group` rollouts of one prompt, score minus the group's mean) and `gate.policy:
always`, so each step's LoRA is released and serves the next request. The task is verifiable:
"Which is larger, A or B? Answer with the number only." (two numbers from 1 to 19), scored 1
when the answer's first number is the larger one. The 135M model meets it about 0.44 of the time
at temperature 1 (a sum, "What is A + B?", about 0.08: too rare a success to learn from in 48).
Both arms see the same prompts in the same order (each `--group` times in a row, so the control
can form its groups) and the same sampling seeds. After each report the bench waits for the step
the recipe owes (SAO: every report; GRPO: every `--group`-th), up to `--step-timeout` seconds, so
that the curve is rollouts against reward, not against the machine's speed.

The arm `sao_old_defaults` is `sao` with the defaults before issue 61 (alpha 0.05, the clip
band 0.2/0.28, four critic steps), beside the paper's in the same run. The arm `sft` is the
supervised recipe on the same stream, with its defaults and `batch_size: 4`: it learns from the
answers scored 1 (those the view does not hold back for the gate's replay), a step per four.

Printed: each arm's cumulative mean reward every 8 rollouts, and the base's (the first
`--group` rollouts, before any step) as the baseline, and per arm its steps and how many had a
non-zero loss; written to bench/out/sao.json (and sao.png with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common.results import OUT
from reef.evaluation.replay import held_back
from reef.testing.processes import ServerProcess, free_port, reef_serve

CONFIG = """
engine:
  llamacpp: {n_ctx: 1024, n_threads: 2}
gate:
  policy: always
learning:
  recipe: RECIPE
  interval_s: 0.5
  batch_size: BATCH
  max_staleness: 18
EXTRA"""
NUMBER = re.compile(r"-?\d+")
# An arm: the recipe it runs, and its settings beyond the config's.
OLD_DEFAULTS = "  eps_clip: 0.2\n  eps_clip_high: 0.28\n  length_alpha: 0.05\n  critic_steps: 4\n"
ARMS = {
    "sao": ("sao", ""),
    "sao_grpo": ("sao_grpo", ""),
    "sao_old_defaults": ("sao", OLD_DEFAULTS),
    "sft": ("sft", ""),
}
SFT_BATCH = 4  # the sft arm's good answers per step


def prompts(count: int, group: int, seed: int = 0) -> list[tuple[str, int]]:
    """`count` comparisons with their answers, each `group` times in a row."""
    rng = random.Random(seed)
    questions = []
    while len(questions) < count:
        a, b = rng.sample(range(1, 20), 2)
        questions += [
            (f"Which is larger, {a} or {b}? Answer with the number only.", max(a, b))
        ] * group
    return questions[:count]


def score(answer: str, expected: int) -> float:
    found = NUMBER.search(answer)
    return 1.0 if found and int(found.group()) == expected else 0.0


def candidates(server: ServerProcess) -> int:
    """The scenario's candidates so far (none before its first: the route says 404)."""
    response = httpx.get(f"{server.url}/reef/scenarios/default/candidates", timeout=30)
    return len(response.json()["data"]) if response.status_code == 200 else 0


def learning_counts(server: ServerProcess) -> dict[str, int]:
    """The scenario's optimiser steps (candidates), how many were released, and the records the
    experience view dropped as served too many releases ago."""
    deadline = time.monotonic() + 60  # the last step may still be on its way to release
    while True:
        found = httpx.get(f"{server.url}/reef/scenarios/default/candidates", timeout=30)
        rows = found.json()["data"] if found.status_code == 200 else []
        settling = any(row.get("state") in ("proposed", "evaluating") for row in rows)
        if not settling or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    status = httpx.get(f"{server.url}/reef/status", timeout=30).json()
    learning = status["learning"]["scenarios"].get("default", {})
    losses = [(row.get("metrics") or {}).get("loss") or [] for row in rows]
    return {
        "steps": len(rows),
        "released": sum(row.get("state") == "released" for row in rows),
        "stale_skipped": int(learning.get("stale_skipped") or 0),
        "nonzero_loss_steps": sum(any(abs(value) > 1e-9 for value in loss) for loss in losses),
    }


def run_arm(
    arm: str, questions: list[tuple[str, int]], args: argparse.Namespace
) -> tuple[list[float], dict[str, int]]:
    """The rewards of the arm's rollouts, in order, and its learning counts at the end."""
    recipe, extra = ARMS[arm]
    if recipe == "sao_grpo":
        extra += f"  group_size: {args.group}\n"
    folder = Path(tempfile.mkdtemp(prefix=f"reef-bench-{arm}-"))
    batch = SFT_BATCH if recipe == "sft" else 1
    config = CONFIG.replace("RECIPE", recipe).replace("BATCH", str(batch))
    (folder / "reef.yaml").write_text(config.replace("EXTRA", extra))
    rewards: list[float] = []
    learnable = 0  # the sft arm's good answers the view offers it (not held back)
    with reef_serve(folder, free_port()).start() as server:
        for number, (question, expected) in enumerate(questions, start=1):
            body = {
                "messages": [{"role": "user", "content": question}],
                "temperature": 1.0,
                "max_tokens": args.max_tokens,
                "seed": number,  # a seed of its own: identical requests would count as retries
            }
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
            receipt = response.headers["x-reef-agent-record-id"]
            answer = response.json()["choices"][0]["message"]["content"] or ""
            reward = score(answer, expected)
            rewards.append(reward)
            before = candidates(server)
            httpx.post(
                f"{server.url}/reef/report",
                json={"references": [receipt], "score": reward},
                timeout=30,
            ).raise_for_status()
            # SAO steps on every scored rollout; the control on each group whose scores differ
            # (a group of equal scores carries no signal, and it waits for none); sft on every
            # SFT_BATCH-th good answer it may learn from.
            group = rewards[-args.group :]
            if recipe == "sft":
                offered = reward == 1.0 and not held_back(receipt)
                learnable += int(offered)
                owes_a_step = offered and learnable % SFT_BATCH == 0
            elif recipe == "sao_grpo":
                owes_a_step = number % args.group == 0 and len(set(group)) > 1
            else:
                owes_a_step = True
            started = time.monotonic()
            while owes_a_step and time.monotonic() - started < args.step_timeout:
                if candidates(server) > before:
                    break
                time.sleep(1.0)
            print(f"{arm} {number}/{len(questions)} reward {reward:.0f}", flush=True)
        counts = learning_counts(server)
    return rewards, counts


def cumulative(rewards: list[float]) -> list[float]:
    return [sum(rewards[: i + 1]) / (i + 1) for i in range(len(rewards))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=48)
    parser.add_argument("--group", type=int, default=4, help="the control's group size")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--step-timeout", type=float, default=600.0)
    parser.add_argument("--arms", default="sao,sao_grpo")
    args = parser.parse_args()
    questions = prompts(args.rollouts, args.group)
    arms = {arm: run_arm(arm, questions, args) for arm in args.arms.split(",")}
    curves = {arm: rewards for arm, (rewards, _) in arms.items()}
    counts = {arm: found for arm, (_, found) in arms.items()}
    base = [r for rewards in curves.values() for r in rewards[: args.group]]
    print(f"\nbase (each arm's first {args.group} rollouts): {sum(base) / max(1, len(base)):.3f}")
    print("rollouts  " + "  ".join(f"{arm:>9}" for arm in curves))
    means = {arm: cumulative(rewards) for arm, rewards in curves.items()}
    for index in range(7, args.rollouts, 8):
        print(f"{index + 1:8d}  " + "  ".join(f"{means[arm][index]:9.3f}" for arm in curves))
    for arm, found in counts.items():
        print(
            f"{arm}: {found['steps']} optimiser step(s), {found['released']} released, "
            f"{found['nonzero_loss_steps']} with a non-zero loss, "
            f"{found['stale_skipped']} record(s) dropped as stale"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "args": vars(args),
        "rewards": curves,
        "cumulative": means,
        "counts": counts,
    }
    (OUT / "sao.json").write_text(json.dumps(result, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for arm, values in means.items():
        plt.plot(range(1, len(values) + 1), values, label=arm)
    plt.xlabel("scored rollouts")
    plt.ylabel("cumulative mean reward")
    plt.legend()
    plt.savefig(OUT / "sao.png", dpi=120)


if __name__ == "__main__":
    main()
