"""Is a preference said only in feedback learned, without forgetting the rest? Preference x recipe.

    .venv/bin/python -m bench.learning.preferences [--preferences sure,short] [--recipes sft]
        [--policies no_regression,improve] [--rounds 3] [--budget 300] [--phrasings]
        [--paths alone,reviser,judged,teacher,demonstration] [--metric-calls 120]
        [--prefill auto,same]

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
the held-out pass rate; of the five held-out prompts whose right answer a pattern can check, in
English or French (`RIGHT`), the share whose answer meets the preference and is right ("Four."
to "What is 5+5?" is short, and wrong); and the correctness tasks passed; each beside the
base's. `improve` (the mean alone) is the old default, kept as the baseline policy that forgot.

With `--phrasings`, each preference is said in each of the ways a person would say it
(`PHRASINGS`: quoted, as the feedback above does; in plain words; as a complaint; as a
question; and as the user's next message in the same session, with a score of 0 and no
feedback): one run per phrasing, so a learner that only hears one form of feedback shows up as
the row that did not move. The phrasings are written here for people, not for a parser: no code
of the bench or of Reef reads them; the regular expressions only check answers.

`--paths` says how the preference reaches the learner (`PATHS`): the recipe alone, a stronger
reviser (judging by words whether its rewrites still answer, or, `judged`, judging that itself:
`content_check: proposer`), the scenario's teacher, or the user's demonstrations; the stronger
model is `bench.common.taught`'s table (see there). The `told` column is the base's share of
training
prompts that meet the preference with the feedback beside the question; `--told` prints it
beside the share that also still answers the question, by hindsight's check by words (the JSON
keeps both). That check refuses an answer in another language than the question's, right or
not, unless it repeats the question's own words or numbers: for a language preference the second
share says little, and the answers must be read.

`--prefill auto,same` runs each once with the prompt lane on (`engine.llamacpp.prefill_weights:
auto`, the server's default) and once without (`same`): a change that serves something else than
what was released under one of them (issue 70) shows as the row that did not move.

`--metric-calls N` gives each run a budget of metric calls (the answers its steps ask the served
model for to score: the recipe's search and the gate's evaluation, as `/reef/status` counts them):
rounds go on, up to `--rounds`, until the steps have spent N (a step is never cut, so the last
may overshoot), and the held-out pass rate after each round is drawn against the calls spent
(`<json stem>-calls.png`). The harness recipes (`harness_evolve`, `gepa`, `skills`,
`meta_harness`) are compared this way.

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
import tempfile
from pathlib import Path

from bench.common.preferences import (
    PATHS,
    PHRASINGS,
    PREFERENCES,
    Preference,
    phrased,
    run,
    told_rates,
)
from bench.common.results import OUT
from bench.common.taught import Table, taught_model
from reef.testing.processes import free_port, reef_serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preferences", default=",".join(p.name for p in PREFERENCES))
    parser.add_argument("--recipes", default="sft,harness_evolve,both")
    parser.add_argument("--policies", default="no_regression")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per round")
    parser.add_argument(
        "--phrasings", action="store_true", help="each preference in every phrasing (PHRASINGS)"
    )
    parser.add_argument(
        "--paths", default="alone", help=f"how the preference reaches the learner: {PATHS}"
    )
    parser.add_argument(
        "--told",
        action="store_true",
        help="only whether the base follows each chosen phrasing when told (no learning)",
    )
    parser.add_argument(
        "--metric-calls",
        type=int,
        help="each run's budget of metric calls (answers its steps score, search and gate): "
        "rounds go on until it is spent, and the pass rate after each is drawn against it",
    )
    parser.add_argument(
        "--prefill",
        default="auto",
        help="which weights read prompts (engine.llamacpp.prefill_weights), one run each: "
        "auto (the server's default), same, or both as auto,same",
    )
    parser.add_argument("--json", type=Path, default=OUT / "preferences.json")
    args = parser.parse_args()
    chosen = [p for p in PREFERENCES if p.name in args.preferences.split(",")]
    if args.phrasings:
        chosen = [
            phrased(p, phrasing)
            for p in chosen
            for phrasing in ["quoted", *PHRASINGS.get(p.name, {})]
        ]
    paths = args.paths.split(",")
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"--paths: unknown {unknown}; choose from {PATHS}")
    if args.told:
        return survey_told(chosen)
    rows = []
    print(
        f"{'preference':18} {'recipe':15} {'path':13} {'prefill':7} {'told':>5} {'held-out':>13} "
        f"{'and right':>13} {'correct':>8} {'release':>10} {'parts':>16} {'rounds':>22} "
        f"{'s':>5} {'calls':>6}"
    )
    table = Table()
    with taught_model(table) as taught_url:
        for preference in chosen:
            for recipe in args.recipes.split(","):
                for policy in args.policies.split(","):
                    for path in paths:
                        for prefill in args.prefill.split(","):
                            row = run(
                                preference,
                                recipe,
                                policy,
                                args.rounds,
                                args.budget,
                                path,
                                (table, taught_url),
                                args.metric_calls,
                                prefill=prefill,
                            )
                            rows.append(row)
                            show(row)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    draw(rows, args.json.with_suffix(".png"))
    if args.metric_calls is not None:
        draw_curves(rows, args.json.with_name(f"{args.json.stem}-calls.png"), args.metric_calls)


def survey_told(chosen: list[Preference]) -> None:
    """The base's `told` rate for each preference as phrased, on one server: which preferences
    the model can follow when told, the ones a recipe alone can learn from its own answers."""
    folder = Path(tempfile.mkdtemp(prefix="reef-told-"))
    (folder / "reef.yaml").write_text("engine:\n  llamacpp: {n_ctx: 1024, n_threads: 2}\n")
    with reef_serve(folder, free_port()).start() as server:
        for preference in chosen:
            told, answering = told_rates(server.url, preference)
            print(
                f"{preference.name:24} told {told:.2f}, still answering {answering:.2f}", flush=True
            )


def show(row: dict) -> None:
    print(
        f"{row['preference']:18} {row['recipe']:15} {row['path']:13} "
        f"{row.get('prefill', 'auto'):7} {row['told']:>5.2f} "
        f"{row['before']:>5.2f} -> {row['after']:<5.2f} "
        f"{row['right_before']:>5.2f} -> {row['right_after']:<5.2f} "
        f"{row['correct_before']:>3} -> {row['correct_after']:<2} "
        f"{row['release']:>10} {'+'.join(row['parts']) or 'base':>16} "
        f"{','.join(row['decisions']):>22} {row['seconds']:>5} {row['metric_calls']:>6}",
        flush=True,
    )
    if row["last_decision"]:
        print(f"{'':10} last decision: {row['last_decision']}", flush=True)


def draw(rows: list[dict], path: Path) -> None:
    """Held-out pass rate and correctness tasks, base and after learning, one group per run
    (needs matplotlib: .[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        f"{r['preference']}\n{r['recipe']}\n{r.get('path', 'alone')}\n{r.get('prefill', 'auto')}"
        for r in rows
    ]
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


def draw_curves(rows: list[dict], path: Path, budget: int) -> None:
    """The held-out pass rate against the metric calls spent, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for row in rows:
        calls, rates = zip(*row["curve"], strict=True)
        axes.plot(calls, rates, marker="o", label=f"{row['preference']}, {row['recipe']}")
    axes.axvline(budget, color="grey", linestyle=":", linewidth=0.8, label="budget")
    axes.axhline(0.75, color="grey", linestyle="--", linewidth=0.8, label="goal 0.75")
    axes.set_xlabel("metric calls (answers scored by the steps: search and gate)")
    axes.set_ylabel("preference, held out")
    axes.set_ylim(-0.03, 1.05)
    axes.legend(fontsize=7)
    figure.suptitle("Score against metric calls, SmolLM2-135M on 2 CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"drawn: {path}")


if __name__ == "__main__":
    main()
