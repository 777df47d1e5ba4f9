"""TTT-Discover on circle packing (26 circles): the best verified sum of radii, step by step,
against the base model's best of the same number of samples, in the same run.

    .venv/bin/python -m bench.learning.tttd_circles [--steps 6] [--starts 2] [--group 4] [--budget
        3600]

In a fresh project, `reef serve` on the embedded SmolLM2-135M with `learning.recipe: tttd` in
manual mode. First the baseline: the base model answers the starting state's prompt as many
times as discovery will sample (temperature 1), and the best verified packing of those is kept.
Then `--steps` discovery steps are queued (`POST /reef/train`), each: PUCT picks `--starts`
states from the archive, `--group` rollouts from each, entropic advantages, one LoRA policy
update, the gate (policy `floor` 0: discovery keeps every update; what it found is verified
whatever the gate says), a release. It prints the best sum of radii per step and draws the curve
(`--curve`, default docs/tttd_circles.png) and the best packing (`--packing`, default
docs/tttd_best_packing.png). The published best for 26 circles is 2.635983.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from reef.recipes.tttd import circles
from reef.recipes.tttd.archive import Archive
from reef.testing.processes import ServerProcess, free_port, reef_serve

CONFIG = """engine:
  llamacpp: {{n_ctx: 1024, n_threads: 1}}
gate:
  policy: floor
  floor: 0.0
  max_tokens: 320
learning:
  recipe: tttd
  mode: manual
  interval_s: 0.5
  circles: {n}
  starts: {starts}
  group_size: {group}
  steps: 4
"""


def baseline(server: ServerProcess, n: int, samples: int) -> list[float]:
    """The base model's rewards on `samples` answers to the starting state's prompt."""
    state = circles.starting_state(n)
    body = {
        "messages": [{"role": "user", "content": circles.prompt(state)}],
        "temperature": 1.0,
        "max_tokens": 320,
    }
    rewards = []
    for number in range(samples):
        answer = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={**body, "seed": 10_000 + number},
            headers={"x-reef-capture": "false"},
            timeout=600,
        ).json()["choices"][0]["message"]["content"]
        rewards.append(circles.reward(circles.parse_centres(answer or "", state)))
    return rewards


def discover(server: ServerProcess, folder: Path, steps: int, budget: float) -> Archive:
    for _ in range(steps):
        httpx.post(
            f"{server.url}/reef/train", json={"scenario": "default", "instruction": "discover"}
        ).raise_for_status()
    path = folder / ".reef/learning/tttd/archive.json"
    started = time.monotonic()
    shown = 0
    while time.monotonic() - started < budget:
        if path.is_file():
            archive = Archive.load(path)
            for entry in archive.history[shown:]:
                rewards = [r for g in entry["groups"] for r in g["rewards"]]
                print(
                    f"step {entry['step']}: best {entry['best']:.4f}, this step's best "
                    f"{entry['step_best']:.4f}, mean {sum(rewards) / len(rewards):.4f}, "
                    f"{entry['skipped_groups']} group(s) skipped",
                    flush=True,
                )
            shown = len(archive.history)
            if shown >= steps:
                return archive
        time.sleep(5)
    raise SystemExit(f"only {shown} of {steps} steps within {budget:.0f} s")


def plot(archive: Archive, base: list[float], per_step: int, start: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    samples = [0] + [entry["step"] * per_step for entry in archive.history]
    axes.plot(samples, [start] + [e["best"] for e in archive.history], marker="o", label="tttd")
    running = [max([start, *base[:count]]) for count in range(len(base) + 1)]
    axes.plot(range(len(running)), running, label="base model, best of the same samples")
    axes.axhline(circles.BEST_KNOWN[26], linestyle="--", color="grey", label="published best")
    axes.set(xlabel="rollouts sampled", ylabel="best sum of radii", title="26 circles")
    axes.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--circles", type=int, default=26)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--budget", type=float, default=3600)
    parser.add_argument("--curve", type=Path, default=Path("docs/tttd_circles.png"))
    parser.add_argument("--packing", type=Path, default=Path("docs/tttd_best_packing.png"))
    arguments = parser.parse_args()
    per_step = arguments.starts * arguments.group
    folder = Path(tempfile.mkdtemp(prefix="reef-tttd-"))
    (folder / "reef.yaml").write_text(
        CONFIG.format(n=arguments.circles, starts=arguments.starts, group=arguments.group)
    )
    start = circles.reward(circles.starting_state(arguments.circles))
    with reef_serve(folder, free_port()).start() as server:
        base = baseline(server, arguments.circles, arguments.steps * per_step)
        print(f"start {start:.4f}; base model best of {len(base)}: {max(base):.4f}", flush=True)
        archive = discover(server, folder, arguments.steps, arguments.budget)
    best = archive.best.reward
    published = circles.BEST_KNOWN.get(arguments.circles)
    print(
        f"tttd best {best:.4f} after {len(archive.history) * per_step} rollouts vs base best "
        f"{max(base):.4f} of {len(base)} ({best / max(base):.3f}x); start {start:.4f}"
        + (f"; published best {published} ({best / published:.1%} of it)" if published else "")
    )
    plot(archive, base, per_step, start, arguments.curve)
    shutil.copy(folder / ".reef/learning/tttd/best.png", arguments.packing)
    print(f"drawn: {arguments.curve}, {arguments.packing}")


if __name__ == "__main__":
    main()
