"""Is a preference said only in feedback text learned? One table: preference x recipe.

    .venv/bin/python bench/preferences.py [--preferences sure,short] [--recipes sft] [--budget 300]

For each preference and recipe, in a fresh project: `reef serve` on the embedded SmolLM2-135M
with the recipe configured as docs/recipes.md shows it; the held-out prompts' pass rate on the
base model (the baseline, measured in the same run); a scripted user asks the training prompts and
answers each miss with a score of 0 and the preference in its own words (no code reads them:
each preference has a scorer, a regular expression, that the recipe uses to accept answers and
the gate to compare); then the time until a release serves, and the held-out pass rate under it.
A run that releases nothing within `--budget` seconds keeps the base's rate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.scripted_user import EVALS, HELD_OUT, TRAINING, ask, eval_tasks
from reef.testing.scripted_user import meets as matches
from reef.testing.scripted_user import pass_rate as held_out_rate


@dataclass(frozen=True)
class Preference:
    name: str
    feedback: str  # what the scripted user says, once, on each miss
    pattern: str  # what an answer that meets it looks like


PREFERENCES = [
    Preference("sure", "Start your answer with the word 'Sure!'", r"^\W*Sure"),
    Preference("short", "Too long. Reply in five words or fewer.", r"^\W*(\S+\s+){0,4}\S+\W*$"),
    Preference("sign-off", "End every answer with the line: Cheers, Reef", r"Cheers, Reef\W*$"),
]
RECIPES = {
    "sft": "recipe: sft\n  batch_size: 6\n  steps: 30\n  max_tokens: 48\n",
    "harness_evolve": "recipe: harness_evolve\n  proposer: hindsight\n  batch_size: 3\n",
}


def project(folder: Path, preference: Preference, recipe: str) -> Path:
    (folder / "evals").mkdir(parents=True)
    (folder / "evals/default.jsonl").write_text(eval_tasks(EVALS, preference.pattern))
    (folder / "reef.yaml").write_text(
        "engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n"
        "gate:\n  policy: improve\n  max_tokens: 32\n"
        f"learning:\n  interval_s: 0.5\n  {RECIPES[recipe]}"
        f"  scorer: {{type: regex, pattern: '{preference.pattern}'}}\n"
    )
    return folder


def answer(url: str, prompt: str) -> httpx.Response:
    return ask(url, prompt, max_tokens=32)


def meets(response: httpx.Response, preference: Preference) -> bool:
    return matches(response, preference.pattern)


def pass_rate(url: str, preference: Preference) -> float:
    return held_out_rate(url, HELD_OUT, preference.pattern, max_tokens=32)


def serving(server: ServerProcess) -> str:
    return str(httpx.get(f"{server.url}/reef/status").json()["serving"].get("default", "base"))


def run(preference: Preference, recipe: str, budget: float) -> dict:
    folder = project(Path(tempfile.mkdtemp(prefix="reef-pref-")), preference, recipe)
    with reef_serve(folder, free_port()).start() as server:
        before = pass_rate(server.url, preference)
        started = time.monotonic()
        for prompt in TRAINING:
            response = answer(server.url, prompt)
            if not meets(response, preference):
                report = {
                    "references": [response.headers["x-reef-agent-record-id"]],
                    "score": 0,
                    "feedback": preference.feedback,
                }
                httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
        while serving(server) == "base" and time.monotonic() - started < budget:
            time.sleep(2)
        released = serving(server)
        seconds = time.monotonic() - started
        after = pass_rate(server.url, preference) if released != "base" else before
    return {
        "preference": preference.name,
        "recipe": recipe,
        "before": before,
        "after": after,
        "release": released,
        "seconds": round(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preferences", default=",".join(p.name for p in PREFERENCES))
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=Path("bench/out/preferences.json"))
    args = parser.parse_args()
    chosen = [p for p in PREFERENCES if p.name in args.preferences.split(",")]
    rows = []
    print(f"{'preference':10} {'recipe':15} {'before':>7} {'after':>7} {'release':>10} {'s':>5}")
    for preference in chosen:
        for recipe in args.recipes.split(","):
            row = run(preference, recipe, args.budget)
            rows.append(row)
            print(
                f"{row['preference']:10} {row['recipe']:15} {row['before']:>7.2f} "
                f"{row['after']:>7.2f} {row['release']:>10} {row['seconds']:>5}",
                flush=True,
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    draw(rows, args.json.with_suffix(".png"))


def draw(rows: list[dict], path: Path) -> None:
    """Before and after bars, one group per preference and recipe (needs matplotlib: .[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['preference']}\n{r['recipe']}\n{r['seconds']} s" for r in rows]
    positions = range(len(rows))
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    axis.bar([p - 0.2 for p in positions], [r["before"] for r in rows], 0.4, label="base")
    axis.bar([p + 0.2 for p in positions], [r["after"] for r in rows], 0.4, label="after learning")
    axis.axhline(0.75, color="grey", linestyle="--", linewidth=0.8, label="goal 0.75")
    axis.set_xticks(list(positions), labels, fontsize=8)
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("held-out pass rate")
    axis.set_title("A preference said only in feedback, SmolLM2-135M on 2 CPU cores")
    axis.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"drawn: {path}")


if __name__ == "__main__":
    main()
