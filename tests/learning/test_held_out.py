"""The gate judges a recipe on what it never learned from: held-out failing prompts never reach
a recipe and become its gate's tasks; a proposal's own tasks made of the prompts it learned from
are dropped; a candidate whose worked examples answer a gate prompt is refused. On a scripted
engine, real SQLite and a real git chain."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reef.config import load_config
from reef.evaluation.held_out import held_out, leaked, shown_prompts
from reef.evaluation.runner import model_generate
from reef.evaluation.tasks import EvalTask, ScorerSpec
from reef.inference.model import LocalModel
from reef.learning.plans import LoadedPlan
from reef.learning.worker import LearningWorker
from reef.releases.workflow import ReleaseWorkflow
from reef.sdk.recipe import Proposal, Recipe, RecipeSettings, StepContext, failing_prompts
from reef.sdk.view import ExperienceView, Trajectory
from reef.store import ExperienceStore, Record, Report
from reef.store.learning import learning_status
from reef.testing.scripted_engine import ScriptedEngine
from reef.testing.scripted_user import eval_tasks
from tests.learning.test_learning_worker import scored_call

LEARNED = "Hi"  # not of the held-out share (gate.seed 0, share 0.25)
HELD = "What is the capital of France?"  # of it
FORMAL = {"type": "regex", "pattern": "Good day"}


class Greeter(RecipeSettings):
    scorer: dict = FORMAL  # type: ignore[type-arg]


class GreetFormally(Recipe):
    """Proposes a formal greeting, and asks to be judged on the very prompts it learned from,
    as gepa, meta_harness and skills did."""

    name = "greet_formally"
    Settings = Greeter

    def __init__(self, settings: RecipeSettings) -> None:
        super().__init__(settings)
        self.seen: list[str] = []

    def ready(self, view: ExperienceView) -> bool:
        return bool(view.turns())

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal:
        turns = [turn for trajectory in batch for turn in trajectory.turns]
        self.seen.extend(turn.prompt for turn in turns)
        consumed = [turn.record_id for turn in turns]
        tasks = failing_prompts(turns, self.settings.scorer)  # type: ignore[attr-defined]
        return Proposal("harness", {"AGENTS.md": b"Say Good day."}, self.name, consumed, tasks)


def test_held_out_prompts_never_reach_a_recipe_and_are_what_its_gate_judges(
    tmp_path: Path,
) -> None:
    assert held_out(HELD, 0.25) and not held_out(LEARNED, 0.25)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(eval_tasks(["Bye"], "."))
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\ngate:\n  max_tokens: 4\n")
    config = load_config(tmp_path / "reef.yaml", env={})
    store = ExperienceStore(config.experience_db)
    recipe = GreetFormally(Greeter())
    plan = LoadedPlan("default", "auto", [recipe])
    learner = LearningWorker(config, store, LocalModel(ScriptedEngine("Hey.")), plans=[plan])
    learned = scored_call(store, LEARNED, "Yo", 0.0, "greet me formally")
    held = scored_call(store, HELD, "Rome.", 0.0, "wrong")

    view = learner.view("default", recipe)
    assert [turn.record_id for turn in view.turns()] == [learned]
    assert [turn.record_id for turn in view.held_out] == [held] and view.counts.held_out == 1
    step = asyncio.run(learner.step("default"))
    assert recipe.seen == [LEARNED]  # the held-out prompt never reached it

    candidate = learner.workflow.candidates.get(step.candidate_id or "")
    judged = [result["task_id"] for result in candidate.evaluation["results"]]
    assert f"held-out:{held}" in judged
    assert f"failing:{learned}" not in judged  # its own task on a prompt it learned from
    signal = learning_status(store)["default"]["signal"]
    assert signal["reports"] == 2 and signal["learned_from"] == 1 and signal["held_out"] == 1
    store.close()


def test_a_candidate_whose_examples_answer_a_gate_prompt_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals/default.jsonl").write_text(eval_tasks(["What is 10 minus 4?", "Bye"], "6"))
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\n")
    config = load_config(tmp_path / "reef.yaml", env={})
    with ExperienceStore(config.experience_db) as store:
        workflow = ReleaseWorkflow(config, store)
        shown = {"user": "what is 10  MINUS 4?", "assistant": "6"}
        files = {"examples.jsonl": (json.dumps(shown) + "\n").encode()}
        candidate = workflow.propose("default", "harness", files)
        generate = model_generate(
            LocalModel(ScriptedEngine("6")), workflow.eval_settings("default")
        )
        gated = asyncio.run(workflow.gate(candidate, generate))
    assert gated.state == "rejected"
    assert gated.decision.startswith("refused: its worked examples answer 1 of the gate's prompts")
    assert workflow.chain.head("default") is None


def test_a_session_opening_with_a_held_out_prompt_is_held_out_whole(tmp_path: Path) -> None:
    with ExperienceStore(tmp_path / "experience.db") as store:
        first = [{"role": "user", "content": HELD}]
        then = [
            *first,
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "No."},
        ]
        for messages, answer in ((first, "Rome."), (then, "Lyon.")):
            record = Record(
                scenario="default",
                request={"messages": messages},
                response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
                engine="test",
                release_id="base",
                session="s1",
            )
            store.add_record(record).result()
            store.add_report(Report("default", [record.id], score=0.0)).result()
        scored_call(store, LEARNED, "Yo", 0.0)
        view = ExperienceView(store, "default", set(), hold_back_at=0.5, hold_out=0.25)
    assert [t.prompt for t in view.turns()] == [LEARNED]
    assert [t.answer_text for t in view.held_out] == ["Rome.", "Lyon."]
    assert (view.counts.held_out, view.counts.waiting) == (2, 1)


REPHRASED = [
    ("What is 10 minus 4?", "What is 10 minus 4"),
    ("What's the capital of France?", "What is the capital of France?"),
    ("What colour is the sky?", "what color is the sky"),
    ("Name a bird.", "Name a bird, please."),
    ("What is 10 minus 4?", "What is ten minus four?"),
    ("Name a bird.", "Give me a bird's name."),
    ("What is the capital of France?", "Could you tell me the capital of France?"),
]
# Rephrasings the split may put apart (a sign for its word, a word added) and the leak check
# still catches: the worker drops a held-out task whose prompt a step learned from, too.
LEAK_ONLY = [
    ("What is 10 minus 4?", "10 - 4 = ?"),
    ("What is 3 times 4?", "What is 3 x 4?"),
    ("What is the capital of France?", "What is the capital city of France?"),
]


@pytest.mark.parametrize(("asked", "rephrased"), REPHRASED)
def test_a_rephrasing_falls_on_the_same_side_of_the_split_and_is_a_leak(
    asked: str, rephrased: str
) -> None:
    """Issue 72: the split key was the prompt lower-cased, so a question mark put a prompt on
    the other side, and an example answering a rephrasing of a gate prompt passed the leak
    check."""
    for seed in range(20):  # whichever side a seed puts it on, both go there
        assert held_out(asked, 0.25, seed) == held_out(rephrased, 0.25, seed)
    task = EvalTask(
        id="held-out:x",
        messages=[{"role": "user", "content": rephrased}],
        scorer=ScorerSpec(type="regex", pattern="."),
    )
    assert leaked([task], shown_prompts([(asked, "An answer.")])) == [task]


@pytest.mark.parametrize(("asked", "rephrased"), LEAK_ONLY)
def test_a_rephrasing_with_a_sign_or_a_word_more_is_a_leak(asked: str, rephrased: str) -> None:
    task = EvalTask(
        messages=[{"role": "user", "content": rephrased}],
        scorer=ScorerSpec(type="regex", pattern="."),
    )
    assert leaked([task], shown_prompts([(asked, "An answer.")])) == [task]


def test_other_questions_are_not_leaks() -> None:
    shown = shown_prompts([("What is 10 minus 3?", "7."), ("Name a fish.", "A trout.")])
    others = ("What is 10 minus 4?", "Name a bird.", "What is the capital of Italy?", "x")
    for other in (*others, "What is 10 plus 3?", "What colour is the sea?"):
        task = EvalTask(
            messages=[{"role": "user", "content": other}],
            scorer=ScorerSpec(type="regex", pattern="."),
        )
        assert leaked([task], shown) == [], other
