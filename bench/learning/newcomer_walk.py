"""The newcomer's walk of issue 60: is the release helping, told by Reef's own surfaces?

    .venv/bin/python -m bench.learning.newcomer_walk [--rounds 3] [--budget 240] [--plain]

In a fresh folder: `reef init`, then `reef.yaml`'s learning section exactly as docs/recipes.md's
first example writes it (read from the doc: a doc that does not run on the embedded model fails
here), `reef serve` on the embedded SmolLM2-135M. Each round a scripted user asks twelve
questions (a third of them sums) and answers each with a plain report: a score of 1 when the
answer ends with the line "Cheers", else 0 with the feedback the doc gives. Then it waits for
the recipe's step, and prints what Reef says: `reef status` (the last step and why, each
release's live pass rate with its 95% interval, the signal's yield) and the PNG of `reef
learning curve`. At the end, the worked examples that serve, each checked for a wrong fact (an
arithmetic statement that does not hold, a sum's answer that misses its result).

`--plain` walks it as a user who writes no regex: the example's `scorer` is left out, so the
gate judges the held-out calls by the users' own words (`reef.evaluation.judge`), with the
served model as the judge unless the project names a teacher or a proposer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.common.results import OUT
from reef.evaluation.facts import wrong_fact
from reef.testing.processes import reef_serve

RECIPES_DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
QUESTIONS = [
    "What is 10 minus 4?",
    "Name an animal.",
    "What is the capital of France?",
    "What is 7 plus 5?",
    "Name a fruit.",
    "What colour is the sky?",
    "What is 3 times 4?",
    "Name a planet.",
    "What is ice made of?",
    "What is 9 minus 2?",
    "Name a metal.",
    "What is the largest ocean?",
]
CHEERS = re.compile(r"Cheers\W*$")


def docs_learning() -> tuple[dict, str]:
    """docs/recipes.md's first example: its `learning` section, and the feedback it says."""
    text = RECIPES_DOC.read_text()
    block = re.search(r"```yaml\n(# reef.yaml\n.*?)```", text, re.DOTALL)
    feedback = re.search(r'"feedback": "([^"]+)"', text)
    assert block and feedback, "docs/recipes.md's first example is not where this bench reads it"
    return yaml.safe_load(block.group(1))["learning"], " ".join(feedback.group(1).split())


def reef(folder: Path, *args: str) -> str:
    env = {**os.environ, "COLUMNS": "160"}
    done = subprocess.run(
        [sys.executable, "-m", "reef", *args], cwd=folder, env=env, capture_output=True, text=True
    )
    return done.stdout + done.stderr


def steps(url: str) -> int:
    found = httpx.get(f"{url}/reef/status").json()["learning"]["scenarios"].get("default", {})
    return int(found.get("batches_built") or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per round")
    parser.add_argument("--plain", action="store_true", help="no scorer: the words judge")
    args = parser.parse_args()
    learning, feedback = docs_learning()
    if args.plain:
        learning.pop("scorer", None)
    root = Path(tempfile.mkdtemp(prefix="reef-walk-"))
    print(reef(root, "init", "walk"), flush=True)
    folder = root / "walk"
    config = yaml.safe_load((folder / "reef.yaml").read_text()) or {}
    config["learning"] = learning
    (folder / "reef.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"learning (from docs/recipes.md): {json.dumps(learning)}", flush=True)
    with reef_serve(folder, 8900).start(timeout=300) as server:
        for number in range(args.rounds):
            before = steps(server.url)
            for question in QUESTIONS:
                body = {"messages": [{"role": "user", "content": question}], "max_tokens": 48}
                answered = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)
                text = answered.json()["choices"][0]["message"]["content"] or ""
                hit = bool(CHEERS.search(text.strip()))
                report = {"references": [answered.headers["x-reef-agent-record-id"]]}
                report |= {"score": 1} if hit else {"score": 0, "feedback": feedback}
                httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
            deadline = time.monotonic() + args.budget
            while steps(server.url) == before and time.monotonic() < deadline:
                time.sleep(2)
            time.sleep(3)  # the head follower swaps a released head within a second
            print(f"\n== after round {number + 1} ==\n{reef(folder, 'status')}", flush=True)
        harness = httpx.get(f"{server.url}/reef/harness").json()
    curve = OUT / "newcomer_walk.png"
    print(reef(folder, "learning", "curve", "--out", str(curve)), flush=True)
    examples = [
        json.loads(line)
        for line in (harness["files"].get("examples.jsonl") or "").splitlines()
        if line.strip()
    ]
    print(f"serving {harness['release_id']}: {len(examples)} worked example(s)")
    for example in examples:
        wrong = wrong_fact(example["user"], example["assistant"])
        verdict = f"WRONG: {wrong}" if wrong else "ok"
        print(f"  {example['user']!r} -> {example['assistant']!r}: {verdict}")


if __name__ == "__main__":
    main()
