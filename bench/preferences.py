"""Is a preference said only in feedback learned, without forgetting the rest? Preference x recipe.

    .venv/bin/python -m bench.preferences [--preferences sure,short] [--recipes sft]
        [--policies no_regression,improve] [--rounds 3] [--budget 300]

For each preference, recipe and gate policy, in a fresh project: `reef serve` on the embedded
SmolLM2-135M with the recipe configured as docs/recipes.md shows it, and in the gate the six
correctness tasks `reef init` writes (short, right answers) beside three tasks for the preference
(group `preference`); a candidate may lose one correctness task per decision (`max_lost: 1`,
the issue's tolerance), none of the replayed good answers. The baseline is the base model,
measured in the same run: the held-out prompts' pass rate for the preference, and how many
correctness tasks it passes. Then, round by
round, a scripted user asks the training prompts and answers each miss with a score of 0 and the
preference in its own words (no code reads them: each preference has a scorer, a regular
expression, that the recipe uses to accept answers and the gate to compare), each hit with a
score of 1; the worker steps; the round ends when each recipe has stepped (its gate decided, or
it proposed nothing). Measurements are never
recorded (they are not traffic to learn from). The table gives, under what serves at the end:
the held-out pass rate and the correctness tasks passed, beside the base's; `improve` (the mean
alone) is the old default, kept as the baseline policy that forgot.

A pair (`sure+sign-off`) asks for two preferences at once: an answer meets it (held out) when it
meets both, and the user's feedback on a miss names only what it misses; the recipes' scorer accepts
an answer that meets both, and the gate has three tasks per part. Recipe `both` runs
`harness_evolve` and `sft` side by side on the scenario (`learning.recipes`): each candidate keeps
the part the other recipe released, so the whole agent (harness and adapter in one release) can win
a pair neither part wins alone. A round then waits for a decision from each recipe.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from bench.results import OUT

from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.testing.scripted_user import (
    EVALS,
    HELD_OUT,
    TRAINING,
    ask,
    correct,
    correctness_tasks,
    eval_tasks,
    meets,
    pass_rate,
)


@dataclass(frozen=True)
class Preference:
    name: str
    feedback: str  # what the scripted user says, once, on each miss
    pattern: str  # what an answer that meets it looks like
    parts: tuple[Preference, ...] = ()  # a pair: both must be met

    @property
    def progress(self) -> str:
        """What a recipe's scorer accepts: for a pair, an answer meeting both parts (hindsight
        edits a miss with each text the feedback asks for, one before the answer and one after)."""
        return self.pattern

    @property
    def task_patterns(self) -> list[str]:
        """The gate's preference tasks: three per part."""
        return [part.pattern for part in self.parts] or [self.pattern]

    def feedback_on(self, answer: str) -> str:
        """What the user says about a missing answer: for a pair, each part it misses."""
        if not self.parts:
            return self.feedback
        missed = [p.feedback for p in self.parts if not re.search(p.pattern, answer.strip())]
        return " ".join(missed) or self.feedback


def pair(first: Preference, second: Preference) -> Preference:
    """Both preferences at once: a pattern that holds when each part's does."""
    pattern = f"(?s)^(?=.*?(?:{first.pattern}))(?=.*?(?:{second.pattern}))"
    both = f"{first.feedback} {second.feedback}"
    return Preference(f"{first.name}+{second.name}", both, pattern, (first, second))


PREFERENCES = [
    Preference("sure", "Start your answer with the word 'Sure!'", r"^\W*Sure"),
    Preference("short", "Too long. Reply in five words or fewer.", r"^\W*(\S+\s+){0,4}\S+\W*$"),
    Preference("sign-off", "End every answer with the line: Cheers, Reef", r"Cheers, Reef\W*$"),
    Preference(  # a format
        "bullet", "Write your answer as one bullet point starting with '- '.", r"^\s*[-*] "
    ),
    Preference(  # a language
        "french", "Answer in French.", r"(?i)\b(le|la|les|est|une|des|du|et|je|vous|oui)\b"
    ),
]
PREFERENCES += [pair(PREFERENCES[0], PREFERENCES[2])]  # sure+sign-off
SFT = {"recipe": "sft", "batch_size": 6, "steps": 30, "max_tokens": 48}
HARNESS_EVOLVE = {"recipe": "harness_evolve", "proposer": "hindsight", "batch_size": 3}
RECIPES = {"sft": [SFT], "harness_evolve": [HARNESS_EVOLVE], "both": [HARNESS_EVOLVE, SFT]}
TOKENS = 32  # max_tokens of every answer measured, and of the gate's


def project(folder: Path, preference: Preference, recipe: str, policy: str) -> Path:
    (folder / "evals").mkdir(parents=True)
    preference_tasks = "".join(
        eval_tasks(EVALS[:3], pattern, group="preference") for pattern in preference.task_patterns
    )
    (folder / "evals/default.jsonl").write_text(correctness_tasks() + preference_tasks)
    (folder / "reef.yaml").write_text(
        "engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n"
        f"gate:\n  policy: {policy}\n  max_tokens: {TOKENS}\n"
        "  groups: {default: {max_lost: 1}}\n"
        f"learning: {json.dumps(learning(preference, recipe))}\n"
    )
    return folder


def learning(preference: Preference, recipe: str) -> dict:
    """The `learning` section: the recipe(s), each accepting answers by the preference."""
    scorer = {"type": "regex", "pattern": preference.progress}
    recipes = [{**settings, "scorer": scorer} for settings in RECIPES[recipe]]
    chosen = {"recipes": recipes} if len(recipes) > 1 else recipes[0]
    return {"interval_s": 0.5, **chosen}


def held_out_rate(url: str, preference: Preference) -> float:
    return pass_rate(url, HELD_OUT, preference.pattern, max_tokens=TOKENS, capture=False)


def steps_so_far(url: str) -> dict[str, int]:
    """Each recipe's learning steps on the scenario so far."""
    status = httpx.get(f"{url}/reef/status").json()["learning"]["scenarios"].get("default", {})
    return {name: found["steps"] for name, found in status.get("recipes", {}).items()}


def next_steps(url: str, before: dict[str, int], recipes: int, budget: float) -> list[str]:
    """The outcome of each recipe's next step after `before` (its gate decided, or it proposed
    nothing), once all `recipes` have stepped or `budget` seconds have passed."""
    deadline = time.monotonic() + budget
    while True:
        status = httpx.get(f"{url}/reef/status").json()["learning"]["scenarios"].get("default", {})
        moved = {
            name: found["last_step"]["outcome"]
            for name, found in status.get("recipes", {}).items()
            if found["steps"] > before.get(name, 0)
        }
        if len(moved) >= recipes or time.monotonic() > deadline:
            return [f"{name}:{outcome}" for name, outcome in sorted(moved.items())]
        time.sleep(2)


def latest_decided(server: ServerProcess) -> dict:
    listed = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    return next((c for c in listed if c["state"] in ("released", "rejected")), {})


def a_round(server: ServerProcess, preference: Preference) -> int:
    """The scripted user asks every training prompt and scores the answer; how many missed."""
    misses = 0
    for prompt in TRAINING:
        response = ask(server.url, prompt, max_tokens=TOKENS)
        hit = meets(response, preference.pattern)
        answer = response.json()["choices"][0]["message"]["content"]
        report = {
            "references": [response.headers["x-reef-agent-record-id"]],
            "score": 1 if hit else 0,
            **({} if hit else {"feedback": preference.feedback_on(answer)}),
        }
        httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
        misses += not hit
    return misses


def run(preference: Preference, recipe: str, policy: str, rounds: int, budget: float) -> dict:
    folder = project(Path(tempfile.mkdtemp(prefix="reef-pref-")), preference, recipe, policy)
    decisions = []
    with reef_serve(folder, free_port()).start() as server:
        before, knew = held_out_rate(server.url, preference), correct(server.url, TOKENS)
        started = time.monotonic()
        for _ in range(rounds):
            before_round = steps_so_far(server.url)
            if not a_round(server, preference):
                decisions.append("no misses")  # nothing left to learn from
                break
            outcomes = next_steps(server.url, before_round, len(RECIPES[recipe]), budget)
            decisions.append("+".join(outcomes))
            if not outcomes or time.monotonic() - started > rounds * budget:
                break
        status = httpx.get(f"{server.url}/reef/status").json()
        release = status["serving"].get("default", "base")
        parts = httpx.get(f"{server.url}/reef/harness").json()["parts"]
        after, knows = held_out_rate(server.url, preference), correct(server.url, TOKENS)
        last = latest_decided(server)
    return {
        "preference": preference.name,
        "recipe": recipe,
        "policy": policy,
        "before": before,
        "after": after,
        "correct_before": len(knew),
        "correct_after": len(knows),
        "forgot": sorted(set(knew) - set(knows)),
        "release": release,
        "parts": parts,
        "decisions": decisions,
        "last_decision": last.get("decision", ""),
        "seconds": round(time.monotonic() - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preferences", default=",".join(p.name for p in PREFERENCES))
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--policies", default="no_regression")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per round")
    parser.add_argument("--json", type=Path, default=OUT / "preferences.json")
    args = parser.parse_args()
    chosen = [p for p in PREFERENCES if p.name in args.preferences.split(",")]
    rows = []
    print(
        f"{'preference':10} {'recipe':15} {'policy':14} {'held-out':>13} {'correct':>8} "
        f"{'release':>10} {'parts':>16} {'rounds':>22} {'s':>5}"
    )
    for preference in chosen:
        for recipe in args.recipes.split(","):
            for policy in args.policies.split(","):
                row = run(preference, recipe, policy, args.rounds, args.budget)
                rows.append(row)
                print(
                    f"{row['preference']:10} {row['recipe']:15} {row['policy']:14} "
                    f"{row['before']:>5.2f} -> {row['after']:<5.2f} "
                    f"{row['correct_before']:>3} -> {row['correct_after']:<2} "
                    f"{row['release']:>10} {'+'.join(row['parts']) or 'base':>16} "
                    f"{','.join(row['decisions']):>22} {row['seconds']:>5}",
                    flush=True,
                )
                if row["last_decision"]:
                    print(f"{'':10} last decision: {row['last_decision']}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    draw(rows, args.json.with_suffix(".png"))


def draw(rows: list[dict], path: Path) -> None:
    """Held-out pass rate and correctness tasks, base and after learning, one group per run
    (needs matplotlib: .[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['preference']}\n{r['recipe']}\n{r['policy']}" for r in rows]
    positions = list(range(len(rows)))
    figure, (rates, knowledge) = plt.subplots(2, 1, figsize=(max(6, 1.5 * len(rows)), 6))
    rates.bar([p - 0.2 for p in positions], [r["before"] for r in rows], 0.4, label="base")
    rates.bar([p + 0.2 for p in positions], [r["after"] for r in rows], 0.4, label="after")
    rates.axhline(0.75, color="grey", linestyle="--", linewidth=0.8, label="goal 0.75")
    rates.set_ylim(0, 1.05)
    rates.set_ylabel("preference, held out")
    rates.set_xticks(positions, [""] * len(rows))
    rates.legend(loc="upper left", fontsize=8)
    knowledge.bar([p - 0.2 for p in positions], [r["correct_before"] for r in rows], 0.4)
    knowledge.bar([p + 0.2 for p in positions], [r["correct_after"] for r in rows], 0.4)
    knowledge.set_ylim(0, 6.3)
    knowledge.set_ylabel("correctness tasks (of 6)")
    knowledge.set_xticks(positions, labels, fontsize=7)
    figure.suptitle("A preference said only in feedback, SmolLM2-135M on 2 CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"drawn: {path}")


if __name__ == "__main__":
    main()
