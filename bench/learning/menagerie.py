"""The menagerie's defining mechanisms, on this tree and on an earlier one, in one run.

    .venv/bin/python -m bench.learning.menagerie [--baseline 964a6d6]   # last round's main
    .venv/bin/python -m bench.learning.menagerie --baseline 2c8c32f      # before issue 61

Each tree's recipes are driven through their public step (`Recipe.propose`) by the same scripted
model and proposer, in a process that imports Reef from that tree (a `git worktree` of
`--baseline`, made and removed by the bench), and each figure is read from what the proposer
was shown:

- **meta_harness**: the release's tree has a 3 kB AGENTS.md and the proposer writes four
  designs of 550 characters (its reply's limit), each file starting and ending with a mark of
  its own; on the fourth, how many earlier designs (the seed's included) its prompt names, how
  many it gives whole, and how many characters it reads;
- **skills**: three failing calls whose answers under the tree are 600 characters with a mark;
  how many of the answers the night reads, and how many characters of them;
- **opd**: whether it starts with no `teacher` set, and what it would learn from then;
- **sao**: its defaults (length-adaptive lambda's alpha, the clip band, critic steps); what
  they do to learning is `bench.learning.sao`'s arms (`sao` against `sao_old_defaults`);
- issue 76's: how many of a serving tree's other files (examples, a skill, the house's rules) a
  meta_harness design keeps, and its history budget at n_ctx 2048; whether an episode search
  may run on the gate's suite; whether self_play keeps "12 - 5 = 8, so the answer is 7" as a
  worked example; whether a distillation teacher is kept beside a checkpoint release.

Printed as a table; written to bench/out/menagerie.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common.results import OUT

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "964a6d6"  # main at the end of last round (issue 61's figures: 2c8c32f)
PROMPTS = ["Name a fruit.", "What is 2+2?", "Name an animal.", "Name a colour."]
WISH = "Start every answer with the word Sure"
DESIGNS = 4
RECIPES = ("meta_harness", "skills", "opd", "sao", "searches", "self_play", "distillation")


def _turns() -> list[Any]:
    from reef.sdk.view import Trajectory, Turn

    reports = [{"score": 0.0, "feedback": WISH}]
    turns = [
        Turn(f"rec_{n}", [{"role": "user", "content": p}], {"role": "assistant", "content": "x"},
             "base", reports)
        for n, p in enumerate(PROMPTS)
    ]  # fmt: skip
    return [Trajectory("t", turns)]


def _said(text: str) -> Any:
    from reef.protocol import Completion

    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return Completion(response={"choices": [choice]}, model="scripted")


def design(number: int, chars: int = 550) -> str:
    """Design `number`'s AGENTS.md: `chars` characters between its two marks."""
    return f"START{number} " + ("Be careful and brief. " * 200)[:chars] + f" END{number}"


def probe_meta_harness() -> dict[str, Any]:
    from reef.sdk.recipe import ProposalRefused, StepContext, load_recipe

    asked: list[str] = []

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        asked.append(messages[0]["content"])
        return json.dumps({"agents_md": design(len(asked)), "rules": ""})

    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Any:
        return _said("Yes.")  # every design fails alike: the history is the only signal

    recipe = load_recipe(
        "meta_harness",
        {"scorer": {"type": "regex", "pattern": "^Sure"}, "max_nodes": DESIGNS},
    )
    seed = {"AGENTS.md": design(0, 3000).encode()}
    context = StepContext("default", "base", seed, ask=ask, generate_under=generate_under)
    with contextlib.suppress(ProposalRefused):  # no tree beats the seed: the step refuses
        recipe.propose(_turns(), context)
    last = asked[-1]
    earlier = range(len(asked))  # the seed (0) and the designs written before the last
    return {
        "designs_shown": len(earlier),
        "named": sum(f"START{n}" in last for n in earlier),
        "whole": sum(f"START{n}" in last and f"END{n}" in last for n in earlier),
        "prompt_chars": len(last),
    }


def probe_skills() -> dict[str, Any]:
    from reef.sdk.recipe import ProposalRefused, StepContext, load_recipe

    asked: list[str] = []
    answer = "ANSWER " + "it depends on the case. " * 25

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        asked.append(messages[0]["content"])
        decision = {"name": "", "description": "", "body": "", "merge_into": ""}
        return json.dumps({**decision, "decision": "skip"})

    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Any:
        return _said(answer)

    recipe = load_recipe("skills", {"scorer": {"type": "regex", "pattern": "^Sure"}})
    tree = {"AGENTS.md": b"Be helpful.\n"}
    context = StepContext("default", "default@1", tree, ask=ask, generate_under=generate_under)
    with contextlib.suppress(ProposalRefused):  # a night of skips proposes nothing
        recipe.propose(_turns(), context)
    night = "\n".join(asked)
    read = night.count("ANSWER")  # every answer is the same: each read holds the same part
    return {
        "answers": len(PROMPTS),
        "answer_chars": len(answer),
        "answers_read": read,
        "chars_read": read * _longest_part(night, answer),
    }


def _longest_part(text: str, answer: str) -> int:
    """How much of `answer`, from its start, `text` holds."""
    for length in range(len(answer), 0, -1):
        if answer[:length] in text:
            return length
    return 0


def probe_opd() -> dict[str, Any]:
    from reef.sdk.recipe import load_recipe

    try:
        loaded = load_recipe("opd", {})
    except Exception as error:
        return {"starts_without_teacher": False, "says": str(error).split("body: ")[-1][:60]}
    teacher = getattr(loaded.settings, "teacher", None)
    return {"starts_without_teacher": True, "teacher": teacher}


def probe_sao() -> dict[str, Any]:
    from reef.sdk.recipe import load_recipe

    settings = load_recipe("sao", {}).settings
    names = ("length_alpha", "eps_clip", "eps_clip_high", "critic_steps")
    return {name: getattr(settings, name) for name in names}


def probe_meta_harness_tree() -> dict[str, Any]:
    """Issue 76: what a released design keeps of the serving tree's other files, and how much
    history the proposer reads at n_ctx 2048."""
    from reef.recipes.meta_harness.recipe import history_budget
    from reef.sdk.recipe import StepContext, load_recipe

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        return json.dumps({"agents_md": "Start with Sure.", "rules": ""})

    def generate_under(files: dict[str, bytes], body: dict[str, Any]) -> Any:
        return _said("Sure! Yes." if b"Sure" in files.get("AGENTS.md", b"") else "Yes.")

    others = {
        "examples.jsonl": b'{"user": "Hi", "assistant": "Hello."}\n',
        "skills/math/SKILL.md": b"Add carefully.\n",
        "rules/house.md": b"No emoji.\n",
    }
    serving = {"AGENTS.md": b"Be polite.\n", **others}
    recipe = load_recipe(
        "meta_harness", {"scorer": {"type": "regex", "pattern": "^Sure"}, "max_nodes": 1}
    )
    context = StepContext("default", "base", serving, ask=ask, generate_under=generate_under)
    proposal = recipe.propose(_turns(), context)
    kept = sum(path in (proposal.files if proposal else {}) for path in others)
    return {
        "serving_files_kept": f"{kept}/{len(others)}",
        "history_chars_n_ctx_2048": history_budget(2048),
    }


def probe_searches() -> dict[str, Any]:
    """Issue 76: whether an episode search may run on the gate's suite (no tasks of its own)."""
    from reef.sdk.prompt_search import EpisodeSearch

    try:
        EpisodeSearch.model_validate({})
    except ValueError:
        return {"searches_the_gate_s_suite": False}
    return {"searches_the_gate_s_suite": True}


def probe_self_play() -> dict[str, Any]:
    """Issue 76: whether an answer with a wrong step and the right last number is a worked
    example."""
    from reef.sdk.recipe import ProposalRefused, StepContext, load_recipe

    designs = [
        [{"kind": "arithmetic", "a": 12, "op": "-", "b": 5}],
        [{"kind": "uppercase", "text": "tiger"}],
    ]
    asked: list[str] = []

    def ask(messages: list[dict[str, str]], json_schema: Any = None, max_tokens: int = 0) -> str:
        asked.append(messages[0]["content"])
        return json.dumps({"tasks": designs[min(len(asked), 2) - 1]})

    def generate(body: dict[str, Any]) -> Any:
        return _said("12 - 5 = 8, so the answer is 7" if body["seed"] % 2 == 0 else "It is 6.")

    recipe = load_recipe("self_play", {"every_s": 0, "attempts": 4})
    context = StepContext("default", "base", {}, ask=ask, generate=generate)
    try:
        proposal = recipe.propose([], context)
    except ProposalRefused:
        return {"wrong_step_kept_as_example": False}
    kept = proposal is not None and b"answer is 7" in proposal.files.get("examples.jsonl", b"")
    return {"wrong_step_kept_as_example": kept}


def probe_teacher_keeper(scratch: Path) -> dict[str, Any]:
    """Issue 76: whether a distillation teacher is kept beside a checkpoint release (its weights
    already hold the student: the teacher would be applied twice)."""
    from reef.sdk.recipe import StepContext
    from reef.sdk.weights import TeacherKeeper

    keeper = TeacherKeeper(StepContext("default", "default@1", {}, work_dir=scratch), "ema")
    assert keeper.scratch is not None
    keeper.scratch.parent.mkdir(parents=True, exist_ok=True)
    keeper.scratch.write_bytes(b"teacher")
    keeper.keep({"checkpoint/model.safetensors": b"merged"})
    kept = [p for p in (scratch / "teachers" / "default").glob("*.pt")]
    return {"teacher_kept_beside_a_checkpoint": bool(kept)}


def probe() -> dict[str, Any]:
    import reef

    with tempfile.TemporaryDirectory() as scratch:
        probes = {
            "meta_harness": lambda: {**probe_meta_harness(), **probe_meta_harness_tree()},
            "skills": probe_skills,
            "opd": probe_opd,
            "sao": probe_sao,
            "searches": probe_searches,
            "self_play": probe_self_play,
            "distillation": lambda: probe_teacher_keeper(Path(scratch)),
        }
        return {
            "reef": str(Path(reef.__file__).parents[2]),
            **{n: _tried(f) for n, f in probes.items()},
        }


def _tried(probe: Any) -> dict[str, Any]:
    """A probe's figures, or what stopped it (a tree without the mechanism's code)."""
    try:
        found: dict[str, Any] = probe()
        return found
    except Exception as error:  # an older tree: its API differs
        return {"probe failed": f"{type(error).__name__}: {str(error)[:60]}"}


def run_on(src: Path) -> dict[str, Any]:
    """`probe()` in a process importing Reef from `src` (a tree's `src/`)."""
    environment = {**os.environ, "PYTHONPATH": str(src)}
    found = subprocess.run(
        [sys.executable, "-m", "bench.learning.menagerie", "--probe"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise SystemExit(f"the probe on {src} failed:\n{found.stderr[-3000:]}")
    return json.loads(found.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict[str, Any]]) -> Table:
    shown = Table(title="The menagerie's mechanisms: before and now")
    shown.add_column("recipe")
    shown.add_column("figure")
    for tree in results:
        shown.add_column(tree, justify="right")
    for recipe in RECIPES:
        keys = {key for found in results.values() for key in found.get(recipe, {})}
        for key in sorted(keys):
            shown.add_row(
                recipe,
                key,
                *(str(found.get(recipe, {}).get(key, "-")) for found in results.values()),
            )
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe()))
        return
    with tempfile.TemporaryDirectory(prefix="reef-menagerie-") as scratch:
        worktree = Path(scratch) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), args.baseline],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        try:
            results = {
                f"before ({args.baseline})": run_on(worktree / "src"),
                "this tree": run_on(ROOT / "src"),
            }
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False
            )
    Console().print(table(results))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "menagerie.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
