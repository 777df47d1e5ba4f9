"""Releases a user can trust: held out, facts kept, against a baseline tree in the same run.

    .venv/bin/python -m bench.learning.trust --baseline-src /tmp/baseline/src
        [--preferences sure,short,sign-off,bullet,french] [--recipe harness_evolve]
        [--rounds 2] [--budget 240]

For each preference, two runs from the base in fresh projects, one after the other: `reef serve`
on this tree, and on the baseline's source tree (`--baseline-src`, e.g. a `git worktree` of
the commit before; the server and its learning worker import Reef from it, `PYTHONPATH` first).
Each is one run of `bench.learning.preferences` (the scripted user, the gate's correctness and
preference tasks, the recipe as docs/recipes.md configures it): the held-out pass rate for the
preference, the share of held-out prompts whose answer meets it and is right, the correctness
tasks passed, and, new here, the worked examples that serve at the end that teach a wrong fact
(an answer to a prompt whose right answer a pattern checks that misses it, or arithmetic that
does not hold: `bench.common.preferences.wrong_example`). The target: no wrong fact in what
serves, at a held-out pass rate no lower than the baseline's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common.preferences import PREFERENCES, run
from bench.common.results import OUT

FIVE = "sure,short,sign-off,bullet,french"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=True)
    parser.add_argument(
        "--this-src", type=Path, help="this tree's src/ pinned elsewhere (default: this checkout)"
    )
    parser.add_argument("--preferences", default=FIVE)
    parser.add_argument("--recipe", default="harness_evolve")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per round")
    parser.add_argument("--json", type=Path, default=OUT / "trust.json")
    args = parser.parse_args()
    for src in (args.baseline_src, args.this_src):
        if src is not None and not (src / "reef" / "__init__.py").is_file():
            parser.error(f"{src} holds no reef package")
    chosen = [p for p in PREFERENCES if p.name in args.preferences.split(",")]
    print(
        f"{'preference':10} {'tree':9} {'held-out':>13} {'and right':>13} {'correct':>9} "
        f"{'examples':>8} {'wrong':>5} {'release':>10}  decisions",
        flush=True,
    )
    rows = []
    for preference in chosen:
        for tree, src in (("this", args.this_src), ("baseline", args.baseline_src)):
            row = run(preference, args.recipe, "no_regression", args.rounds, args.budget, src=src)
            row["tree"] = tree
            rows.append(row)
            show(row)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2))
    for tree in ("this", "baseline"):
        mine = [r for r in rows if r["tree"] == tree]
        if mine:
            held = sum(r["after"] for r in mine) / len(mine)
            right = sum(r["right_after"] for r in mine) / len(mine)
            wrong = sum(len(r["wrong_facts"]) for r in mine)
            print(
                f"{tree:9} mean held-out {held:.2f}, held-out and right {right:.2f}, "
                f"wrong facts in what serves {wrong}",
                flush=True,
            )


def show(row: dict) -> None:
    print(
        f"{row['preference']:10} {row['tree']:9} "
        f"{row['before']:.2f} -> {row['after']:.2f} {row['right_before']:.2f} -> "
        f"{row['right_after']:.2f} {row['correct_before']:>3} -> {row['correct_after']:<3} "
        f"{len(row['examples']):>8} {len(row['wrong_facts']):>5} {row['release']:>10}  "
        f"{', '.join(row['decisions'])}",
        flush=True,
    )
    for example in row["wrong_facts"]:
        print(f"    wrong: {example['user']!r} -> {example['assistant']!r}", flush=True)


if __name__ == "__main__":
    main()
