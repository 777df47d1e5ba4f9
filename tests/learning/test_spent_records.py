"""A step that learns nothing from its batch sets those records aside for its recipe (issue 72:
"dropped: 12 content check" counted rewrites again at every step): the next step takes the next
ones instead of the oldest failing turns for ever, each call's drop is counted once, and a new
report on a record makes it worth another try. And a demonstration a program finds wrong never
becomes a worked example.

On a real SQLite store with the real learning worker and `harness_evolve`'s hindsight proposer;
the served model is scripted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from reef.config import load_config
from reef.inference.model import LocalModel
from reef.learning.plans import LoadedPlan
from reef.learning.worker import LearningWorker
from reef.protocol import ChatRequest
from reef.sdk.recipe import load_recipe
from reef.store import ExperienceStore, Record, Report
from reef.store.learning import signal_yield
from reef.testing.scripted_engine import ScriptedEngine

SIGN_OFF = "End your answer with the line: Cheers"
ANSWERS = {
    "What is 10 minus 4?": "10 minus 4 is 2.",  # wrong: its relabel fails the content check
    "What is the capital of France?": "The capital of France is Paris.",
    "What is 12 minus 4?": "I am not sure.",
    "Take 4 from 12.": "I am not sure.",
}


def worker(folder: Path) -> LearningWorker:
    (folder / "reef.yaml").write_text(
        f"state_dir: {folder}/.reef\ngate:\n  policy: always\n  held_out: 0\n"
    )
    config = load_config(folder / "reef.yaml", env={})
    settings = {
        "proposer": "hindsight",
        "batch_size": 1,
        "scorer": {"type": "regex", "pattern": r"Cheers\W*$"},
    }
    plan = LoadedPlan("default", "auto", [load_recipe("harness_evolve", settings)])

    def scripted(request: ChatRequest) -> str:
        return ANSWERS.get(str(request.messages[-1].content), "I am not sure.")

    store = ExperienceStore(config.experience_db)
    return LearningWorker(config, store, LocalModel(ScriptedEngine(scripted)), plans=[plan])


def failing(store: ExperienceStore, prompt: str, feedback: Any = SIGN_OFF) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": prompt}]},
        response={"choices": [{"message": {"role": "assistant", "content": ANSWERS[prompt]}}]},
        engine="test",
        release_id="base",
    )
    record_id = store.add_record(record).result()
    report(store, record_id, feedback)
    return record_id


def report(store: ExperienceStore, record_id: str, feedback: Any = SIGN_OFF) -> None:
    store.add_report(Report("default", [record_id], score=0.0, feedback=feedback)).result()


def steps(learner: LearningWorker, count: int) -> list[str]:
    return [asyncio.run(learner.step("default")).outcome for _ in range(count)]


def test_a_turn_that_teaches_nothing_does_not_stop_the_next(tmp_path: Path) -> None:
    learner = worker(tmp_path)
    wrong = failing(learner.store, "What is 10 minus 4?")
    failing(learner.store, "What is the capital of France?")
    # Before: the oldest failing turn was the batch at every step, and learning stopped there.
    assert steps(learner, 3) == ["no proposal", "released", "waiting"]
    (candidate,) = learner.workflow.candidates.list("default")
    examples = (candidate.folder / "examples.jsonl").read_text()
    assert "Paris" in examples and "10 minus 4" not in examples
    # Its drop was counted once, however many steps ran since.
    assert steps(learner, 2) == ["waiting", "waiting"]
    assert signal_yield(learner.store)["default"]["dropped"]["content check"] == 1
    # A new report on the spent call: worth another try (it teaches nothing still).
    report(learner.store, wrong)
    assert steps(learner, 2) == ["no proposal", "waiting"]
    assert signal_yield(learner.store)["default"]["dropped"]["content check"] == 2
    learner.store.close()


def test_a_spent_call_is_tried_again_once_the_user_says_what_they_wanted(tmp_path: Path) -> None:
    learner = worker(tmp_path)
    silent = failing(learner.store, "What is the capital of France?", feedback=None)
    # A failing turn with no feedback text: dropped, so spent ("no feedback text").
    assert steps(learner, 2) == ["no proposal", "waiting"]
    report(learner.store, silent, SIGN_OFF)  # the user says what they wanted: tried again
    assert steps(learner, 1) == ["released"]
    learner.store.close()


def test_a_wrong_demonstration_is_never_shown(tmp_path: Path) -> None:
    learner = worker(tmp_path)
    failing(learner.store, "What is 12 minus 4?", {"demonstration": "12 minus 4 is 1.\n\nCheers"})
    failing(learner.store, "Take 4 from 12.", {"demonstration": "12 minus 4 is 8.\n\nCheers"})
    assert steps(learner, 3) == ["no proposal", "released", "waiting"]
    (candidate,) = learner.workflow.candidates.list("default")
    shown = [json.loads(line) for line in (candidate.folder / "examples.jsonl").open()]
    assert [example["assistant"] for example in shown] == ["12 minus 4 is 8.\n\nCheers"]
    learner.store.close()
