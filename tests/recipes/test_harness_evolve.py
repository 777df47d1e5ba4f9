"""The harness_evolve recipe: mutations, proposers, and garbage that never becomes a candidate."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from reef.engines.llamacpp import LlamaCppEngine
from reef.evaluation.tasks import ScorerSpec
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest, Completion
from reef.recipes.harness_evolve.mutations import Mutation, MutationRefused, apply, parse_mutation
from reef.recipes.harness_evolve.proposers import HindsightProposer, RuleProposer
from reef.recipes.harness_evolve.recipe import HarnessEvolve
from reef.sdk.hindsight import answers_the_question
from reef.sdk.recipe import RecipeError, StepContext, load_recipe
from reef.sdk.view import Trajectory, Turn

SIGN_OFF = "End every answer with the line: Cheers, Reef"

NOTHING_KEPT = "no answer given under the feedback met it (the scorer said) and still answered"


def turn(
    record_id: str,
    prompt: str,
    answer: str,
    score: float | None = 0.0,
    feedback: str | None = SIGN_OFF,
) -> Turn:
    reports = [{"score": score, "feedback": feedback}]
    return Turn(
        record_id,
        [{"role": "user", "content": prompt}],
        {"role": "assistant", "content": answer},
        "base",
        reports,
    )


def context(
    files: dict[str, bytes] | None = None, reply: str | None = None, asked: list | None = None
) -> StepContext:
    def ask(
        messages: list[dict[str, str]], json_schema: dict | None = None, max_tokens: int = 400
    ) -> str:
        if asked is not None:
            asked.append(messages)
        return reply or ""

    return StepContext("default", "base", files or {}, recent_rejections=["rule x: worse"], ask=ask)


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ("I think the harness is fine.", "no JSON object"),
        ('{"op": "rename", "path": "rules/a.md", "content": "x"}', "op must be"),
        ('{"op": "create", "path": "../../etc/passwd", "content": "x"}', "outside the harness"),
        ('{"op": "create", "path": "/abs.md", "content": "x"}', "outside the harness"),
        ('{"op": "create", "path": "rules/a.md", "content": "  "}', "empty content"),
        ('{"op": "create", "path": "rules/a.md", "content": "' + "x" * 9000 + '"}', "over 8000"),
        (
            '{"op": "create", "path": "examples.jsonl", "content": "not json"}',
            "examples.jsonl lines",
        ),
        ('{"op": "create", "path": "rules/a.md", "content": 5}', "must be strings"),
    ],
)
def test_garbage_proposals_are_refused_with_a_reason(reply: str, says: str) -> None:
    with pytest.raises(MutationRefused, match=says):
        parse_mutation(reply, max_bytes=8000)


def test_a_mutation_is_found_inside_chatter_and_applied_to_a_copy() -> None:
    reply = (
        'Sure! {"op": "create", "path": "rules/tone.md", "content": "Be kind.", "reason": "rude"}'
    )
    mutation = parse_mutation(reply, max_bytes=8000)
    files = {"AGENTS.md": b"You help."}
    changed = apply(files, mutation)
    assert changed == {"AGENTS.md": b"You help.", "rules/tone.md": b"Be kind."}
    assert files == {"AGENTS.md": b"You help."}
    with pytest.raises(MutationRefused, match="already exists"):
        apply(changed, mutation)
    with pytest.raises(MutationRefused, match="does not exist"):
        apply(files, Mutation("remove", "rules/none.md", "", "x"))


@pytest.mark.e2e
def test_hindsight_proposer_shows_answers_given_under_the_feedback(
    engine: LlamaCppEngine,
) -> None:
    """The real model answers the failing prompts with the feedback beside them; answers that meet
    the scorer become worked examples: exactly the first finished one per prompt, whatever the
    model sampled on this machine (the test reads what it sampled). No code reads the feedback's
    wording."""
    model = LocalModel(engine)
    sampled: list[tuple[dict, Completion]] = []

    def generate(body: dict) -> Completion:
        completion = asyncio.run(model.complete(ChatRequest.model_validate(body)))
        sampled.append((body, completion))
        return completion

    wanted = "Start your answer with the word 'Sure!'"
    prompts = ["What is 2+2?", "Name a fruit.", "What colour is the sky?"]
    failures = [
        turn(f"r{n}", prompt, "An answer.", feedback=wanted) for n, prompt in enumerate(prompts)
    ]
    scorer = ScorerSpec(type="regex", pattern="^\\W*Sure")
    result = HindsightProposer(generate, scorer, max_examples=4, samples=4, revisions=0).propose(
        failures, context()
    )

    def answer(completion: Completion, failure: Turn) -> str | None:
        """The answer's text if the proposer may keep it: finished, meeting the scorer, and still
        an answer to the question (its rule tested in test_hindsight.py)."""
        choice = completion.response["choices"][0]
        text = choice["message"]["content"]
        finished = choice["finish_reason"] == "stop"
        kept = finished and re.search("^\\W*Sure", text)
        return text.strip() if kept and answers_the_question(text, failure, wanted) else None

    qualifying: dict[str, str] = {}
    for prompt, failure in zip(prompts, failures, strict=True):
        hinted = f"{prompt} {wanted}"
        bodies = [body for body, _ in sampled if body["messages"][-1]["content"] == hinted]
        asked = [completion for body, completion in sampled if body in bodies]
        assert [b["seed"] for b in bodies] == list(range(len(bodies)))
        assert bodies[0]["temperature"] == 0  # the first sample is greedy
        first = next((i for i, c in enumerate(asked) if answer(c, failure)), None)
        # Sampled until the first answer that may be kept (one per prompt), or 4 times.
        assert len(asked) == (4 if first is None else first + 1)
        if first is not None:
            qualifying[prompt] = answer(asked[first], failure)  # type: ignore[assignment]
    assert len(sampled) == sum(
        body["messages"][-1]["content"] in {f"{p} {wanted}" for p in prompts} for body, _ in sampled
    )  # and nothing else was asked
    if not qualifying:
        assert result == NOTHING_KEPT
    else:
        assert isinstance(result, Mutation) and result.path == "examples.jsonl", result
        examples = [json.loads(line) for line in result.content.splitlines()]
        assert {e["user"]: e["assistant"] for e in examples} == qualifying
    unreachable = ScorerSpec(type="contains", value="zebra-quartz-91")
    sampled.clear()
    refused = HindsightProposer(generate, unreachable, samples=2, revisions=0).propose(
        failures, context()
    )
    assert refused == NOTHING_KEPT
    assert len(sampled) == 2 * len(prompts)


def test_a_demonstration_becomes_a_worked_example_without_asking_the_model() -> None:
    def generate(body: dict) -> Completion:
        raise AssertionError("a demonstration needs no model")

    shown = {"demonstration": "  Four.\nCheers, Reef \n"}
    failures = [
        Turn(
            "r1",
            [{"role": "user", "content": "What is 2+2?"}],
            {"content": "4"},
            "base",
            [{"score": 0.0, "feedback": shown}],
        )
    ]
    existing = {"examples.jsonl": b'{"user": "Hi", "assistant": "Hello.\\nCheers, Reef"}\n'}
    mutation = HindsightProposer(generate, None).propose(failures, context(existing))
    assert isinstance(mutation, Mutation) and mutation.op == "update"
    assert [json.loads(line) for line in mutation.content.splitlines()] == [
        {"user": "Hi", "assistant": "Hello.\nCheers, Reef"},
        {"user": "What is 2+2?", "assistant": "Four.\nCheers, Reef"},
    ]
    assert "1 answer(s) the user wrote" in mutation.reason
    nothing = [turn("r2", "Hi", "Yo.", feedback=None)]
    assert HindsightProposer(generate, None).propose(nothing, context()) == (
        "the failing turns carry no feedback text or demonstration to act on"
    )


def test_rule_proposer_keeps_other_feedback_as_a_rule() -> None:
    failures = [turn("r1", "Hi", "Yo.", feedback="Please greet me formally.")]
    mutation = RuleProposer().propose(failures, context())
    assert isinstance(mutation, Mutation)
    assert (mutation.op, mutation.path, mutation.content) == (
        "create",
        "rules/feedback.md",
        "- Please greet me formally.\n",
    )


def test_recipe_batches_failing_turns_and_proposes_with_the_rule_proposer() -> None:
    recipe = load_recipe(
        "harness_evolve",
        {
            "proposer": "rule",
            "batch_size": 2,
            "scorer": {"type": "regex", "pattern": "Cheers, Reef$"},
        },
    )
    assert isinstance(recipe, HarnessEvolve)
    good = Trajectory("g", [turn("g", "Hello", "Hi.\nCheers, Reef", score=1.0, feedback=None)])
    bad = [Trajectory(f"b{n}", [turn(f"b{n}", f"Question {n}?", "An answer.")]) for n in range(2)]
    proposal = recipe.propose([good, *bad], context({"AGENTS.md": b"You help."}))
    assert proposal is not None and proposal.kind == "harness"
    assert set(proposal.files) == {"AGENTS.md", "rules/feedback.md"}
    assert proposal.consumed_record_ids == ["g", "b0", "b1"]
    # Never judged on the prompts it learned from: the worker adds the held-out calls' tasks.
    assert proposal.eval_tasks == []


def test_llm_proposer_sees_failures_and_rejections_and_garbage_is_refused() -> None:
    recipe = load_recipe("harness_evolve", {"proposer": "llm", "batch_size": 1})
    batch = [Trajectory("b", [turn("b", "What is 2+2?", "Five.")])]
    asked: list = []
    with pytest.raises(MutationRefused, match="no JSON object"):
        recipe.propose(batch, context(reply="I cannot help with that.", asked=asked))
    prompt = asked[0][0]["content"]
    assert "What is 2+2?" in prompt and SIGN_OFF in prompt and "rule x: worse" in prompt
    good = '{"op": "create", "path": "rules/math.md", "content": "Check sums.", "reason": "wrong"}'
    proposal = recipe.propose(batch, context(reply=good))
    assert proposal is not None and proposal.files["rules/math.md"] == b"Check sums."


def test_bad_recipe_references_and_settings_are_named() -> None:
    with pytest.raises(RecipeError, match="neither an installed recipe"):
        load_recipe("nope", {})
    with pytest.raises(RecipeError, match="cannot import recipe module 'no_such_module'"):
        load_recipe("no_such_module:Recipe", {})
    with pytest.raises(RecipeError, match="not a Recipe subclass"):
        load_recipe("reef.config:ReefConfig", {})
    with pytest.raises(RecipeError, match="threshhold: unknown key"):
        load_recipe("harness_evolve", {"threshhold": 0.2})


def test_pareto_selection_mutates_a_tree_from_the_pareto_set() -> None:
    from reef.recipes.harness_evolve.recipe import pareto_front
    from reef.sdk.recipe import Evaluated

    a = Evaluated("a", {"AGENTS.md": b"A"}, {"t1": 1.0, "t2": 0.0})
    b = Evaluated("b", {"AGENTS.md": b"B"}, {"t1": 0.0, "t2": 1.0})
    c = Evaluated("c", {"AGENTS.md": b"C"}, {"t1": 0.5, "t2": 0.0})  # a beats it everywhere
    assert pareto_front([a, b, c]) == [a, b]

    recipe = load_recipe(
        "harness_evolve", {"proposer": "rule", "batch_size": 1, "selection": "pareto"}
    )
    batch = [Trajectory("x", [turn("x", "Hi", "Yo.", feedback="Please greet me formally.")])]
    step = StepContext("default", "default@1", {"AGENTS.md": b"current"}, evaluated=[a, b, c])
    proposal = recipe.propose(batch, step)
    assert proposal is not None
    assert proposal.files["AGENTS.md"] == b"B"  # 3 evaluated, front of 2: the second in turn
    assert b"formally" in proposal.files["rules/feedback.md"]


def test_a_turn_the_teacher_answered_is_learned_from_whatever_its_score() -> None:
    """The teacher answered a call the student failed and reported its answer as a
    demonstration; the user scored that answer 1. The hindsight proposer still shows it."""
    recipe = load_recipe("harness_evolve", {"proposer": "hindsight", "batch_size": 1})
    taught = Turn(
        "t1",
        [{"role": "user", "content": "What is 2+2?"}],
        {"content": "Four."},
        "base",
        [{"feedback": {"demonstration": "Four."}}, {"score": 1.0}],
    )
    liked = turn("l1", "Hi", "Hello.", score=1.0, feedback=None)

    def generate(body: dict) -> Completion:
        raise AssertionError("a demonstration needs no model")

    ctx = StepContext("default", "base", {}, generate=generate)
    assert [t.record_id for t in recipe.failing_turns([Trajectory("t", [taught, liked])])] == ["t1"]
    proposal = recipe.propose([Trajectory("t", [taught])], ctx)
    assert proposal is not None
    assert proposal.files["examples.jsonl"] == b'{"user": "What is 2+2?", "assistant": "Four."}\n'
