"""Where a recipe has no scorer, the users' feedback in their own words judges the gate's
feedback tasks: a judge model asked whether each sampled answer does what the feedback asks, and
trusted only as far as it refuses the answers users failed.

The served model is a scripted engine: the candidate (a harness whose system prompt says
`candidate`) signs off with "Cheers" on the seeds it is given; the judge's question is answered
by reading the answer the prompt quotes, as a judge that understands would (or "yes" to all, as
a small model does). The teacher as judge is the loopback OpenAI peer, over real HTTP.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from reef.config import GateConfig, ReefConfig
from reef.evaluation.judge import FOLLOWS_PROMPT, JUDGE_CHARS, FeedbackJudge, JudgeUnavailable
from reef.evaluation.runner import EvalSettings, PairedReport, model_generate, run_paired
from reef.evaluation.scorers import ScorerError, score
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec
from reef.inference.binding import BASE_BINDING, Binding
from reef.inference.model import LocalModel
from reef.protocol import ChatRequest
from reef.releases.gate import decide
from reef.releases.gating import feedback_judge
from reef.sdk.recipe import Recipe, RecipeError, RecipeSettings, load_recipe
from reef.sdk.view import Turn
from reef.testing.processes import ServerProcess
from reef.testing.scripted_engine import ScriptedEngine
from tests.releases.test_records_returned import workflow_in

CANDIDATE = Binding(release_id="candidate", kind="harness", system_prompt="candidate")
SAMPLED = EvalSettings(temperature=1.0, seed=0, max_tokens=16, samples=8)
WANTED = "End your answer with the line: Cheers"
JUDGED = "Does the new answer do what the feedback asks?"


def failed_turn(number: int, feedback: object = WANTED) -> Turn:
    reports = [{"score": 0.0, "feedback": feedback}] if feedback else [{"score": 0.0}]
    return Turn(
        record_id=f"r{number}",
        messages=[{"role": "user", "content": f"Name fruit number {number}."}],
        answer={"role": "assistant", "content": "A pear."},
        release_id="base",
        reports=reports,
    )


def scripted(signs_off: set[int], judge: str = "reads") -> ScriptedEngine:
    """The candidate signs off on the seeds in `signs_off`, the current release never; the
    judge reads the quoted answer (`reads`), or says yes to anything (`yes`)."""

    def answer(request: ChatRequest) -> str:
        asked = str(request.messages[-1].content)
        if JUDGED in asked:
            assert request.messages[0].content != "candidate"  # judged alone, not as a side
            if judge == "yes":
                return "Yes."
            quoted = asked.split("A new answer:\n", 1)[1]
            return "Yes." if re.search(r"Cheers\s*\n\s*Does", quoted) else "No."
        candidate = request.messages[0].content == "candidate"
        return "A pear.\n\nCheers" if candidate and request.seed in signs_off else "A pear."

    return ScriptedEngine(answer)


def gate_on(engine: ScriptedEngine, tasks: list[EvalTask]) -> PairedReport:
    generate = model_generate(LocalModel(engine), SAMPLED)
    judge = feedback_judge(ReefConfig(), "default", generate)
    return asyncio.run(run_paired(tasks, BASE_BINDING, CANDIDATE, generate, SAMPLED, judge=judge))


class Plain(Recipe):
    """A recipe without a scorer: what its users say is all it has."""

    reads_feedback_text = True


class Verified(Recipe):
    """A recipe that learns from a verifier's rewards, never from what users say."""


def held_out() -> list[EvalTask]:
    return Plain(RecipeSettings()).held_out_tasks([failed_turn(n) for n in range(3)])


def test_a_recipe_without_a_scorer_is_judged_on_its_users_words() -> None:
    turns = [failed_turn(0), failed_turn(1, feedback=None), failed_turn(2, {"hint": "shorter"})]
    tasks = Plain(RecipeSettings()).held_out_tasks(turns)
    assert [t.id for t in tasks] == ["held-out:r0", "held-out:r2"]  # nothing said: no task
    assert {t.group for t in tasks} == {FEEDBACK_GROUP}
    assert tasks[0].scorer == ScorerSpec(type="feedback", criterion=WANTED, failed="A pear.")
    assert tasks[1].scorer.criterion == "shorter"
    # A recipe that never read the users' words is not judged on them.
    assert Verified(RecipeSettings()).held_out_tasks(turns) == []


def test_a_gain_on_the_users_words_is_released_saying_who_judged() -> None:
    report = gate_on(scripted(signs_off=set(range(7))), held_out())
    assert report.judge is not None and (report.judge.refused, report.judge.asked) == (3, 3)
    decision, why = decide(GateConfig(), report)
    assert decision == "released", why
    assert "feedback 0/24 -> 21/24" in why
    refused = "which refused 3/3 [44%-100%] of the answers users failed"
    assert f"judged by the served model alone, {refused}" in why
    assert report.summary()["judge"] == {
        "judge": "the served model alone",
        "refused": 3,
        "asked": 3,
        "answers": 6,  # each side's distinct answers, on each prompt
        "passed": 3,
    }


def test_no_gain_on_the_users_words_is_not_released() -> None:
    decision, why = decide(GateConfig(), gate_on(scripted(signs_off=set()), held_out()))
    assert decision == "rejected"
    assert "group feedback does not improve" in why and "(0/24 -> 0/24" in why
    # It passed nothing: it may be the candidate, or a judge that says no to everything.
    assert "passed none of the 3 answers of either side and may not see a gain" in why


def test_a_judge_that_passes_what_users_failed_cannot_decide() -> None:
    # Yes to everything: both sides pass every sample, and the failed answers too.
    report = gate_on(scripted(signs_off=set(), judge="yes"), held_out())
    assert report.judge is not None and report.judge.refused == 0
    decision, why = decide(GateConfig(), report)
    assert decision == "held"
    assert "refused 0/3 [0%-56%] of the answers users failed, below gate.judge_agreement 80%" in why
    assert "learning.proposer_url" in why  # what to do about it
    # A scenario that accepts such a judge says so.
    decision, _ = decide(GateConfig(judge_agreement=0.0), report)
    assert decision == "rejected"  # trusted, it sees no gain (24/24 -> 24/24)


def test_the_teacher_judges_when_one_is_configured(
    peer: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    config = ReefConfig.model_validate(
        {"teacher": {"url": f"{peer.url}/v1", "model": "reply:yes", "api_key_env": "JUDGE_KEY"}}
    )
    judge = feedback_judge(config, "default", model_generate(LocalModel(scripted(set())), SAMPLED))
    assert judge.name == "the teacher (reply:yes)"
    agreement = asyncio.run(judge.agreement(held_out()))
    assert (agreement.refused, agreement.asked) == (0, 3)
    seen = httpx.get(peer.url + "/peer/last").json()
    assert seen["authorization"] == "Bearer sk-judge"
    assert JUDGED in seen["body"]["messages"][0]["content"]
    assert seen["body"]["temperature"] == 0.0


def test_a_judge_that_cannot_be_asked_fails_the_gate_saying_where() -> None:
    ask = feedback_judge(
        ReefConfig.model_validate({"teacher": {"url": "http://127.0.0.1:9/v1"}}),
        "default",
        model_generate(LocalModel(scripted(set())), SAMPLED),
    )
    with pytest.raises(Exception, match=r"the judge at http://127.0.0.1:9/v1 did not answer"):
        asyncio.run(ask.agreement(held_out()))


def test_a_judge_that_refuses_says_its_status_and_the_model_asked(peer: ServerProcess) -> None:
    config = ReefConfig.model_validate({"teacher": {"url": f"{peer.url}/v1", "model": "fail-404"}})
    judge = feedback_judge(config, "default", model_generate(LocalModel(scripted(set())), SAMPLED))
    with pytest.raises(JudgeUnavailable, match="answered HTTP 404, asked for model 'fail-404'"):
        asyncio.run(judge.agreement(held_out()))


def test_plain_words_are_a_gate_only_scorer() -> None:
    task = held_out()[0]
    with pytest.raises(ScorerError, match="judged by the gate's judge model"):
        score(task.scorer, "A pear.", task)
    unjudged = FeedbackJudge("nobody", lambda prompt: asyncio.sleep(0, "yes"))
    empty = task.model_copy(update={"scorer": ScorerSpec(type="feedback")})
    with pytest.raises(ScorerError, match="needs `criterion`"):
        asyncio.run(unjudged.score(empty, "A pear."))


def test_the_workflow_s_gate_judges_a_recipe_s_held_out_words(tmp_path: Path) -> None:
    """Through the release workflow, as the learning worker hands it a step's held-out tasks:
    the judge is built, asked, and named in the stored decision and evaluation."""
    workflow = workflow_in(tmp_path)
    try:
        candidate = workflow.propose("default", "harness", {"AGENTS.md": b"Sign off.\n"})

        async def generate(request: ChatRequest, binding: Binding) -> str:
            asked = str(request.messages[-1].content)
            if JUDGED in asked:
                assert binding.kind == "base"
                return "Yes" if "Cheers\n\nDoes" in asked else "No"
            return "A pear.\n\nCheers" if binding.kind == "harness" else "A pear."

        gated = asyncio.run(workflow.gate(candidate, generate, extra_tasks=held_out()))
    finally:
        workflow.candidates.store.close()
    assert gated.state == "released", gated.decision
    assert "judged by the served model alone, which refused 3/3" in (gated.decision or "")
    assert gated.evaluation is not None and gated.evaluation["judge"]["refused"] == 3


def test_the_judge_reads_a_page_of_feedback_cut_to_fit() -> None:
    """A feedback of pages must not push the judge's prompt past its window: each part is cut
    to `JUDGE_CHARS` characters."""
    asked: list[str] = []

    async def ask(prompt: str) -> str:
        asked.append(prompt)
        return "no"

    task = held_out()[0]
    long = task.model_copy(
        update={"scorer": ScorerSpec(type="feedback", criterion="Cheers! " * 2000, failed="A")}
    )
    asyncio.run(FeedbackJudge("a judge", ask).score(long, "A pear. " * 2000))
    (prompt,) = asked
    assert len(prompt) < 3 * JUDGE_CHARS + len(FOLLOWS_PROMPT) + 20
    assert prompt.count(" […]") == 2


@pytest.mark.parametrize("recipe", ["sft", "harness_evolve", "gepa"])
def test_a_recipe_s_scorer_in_plain_words_is_refused_at_load_saying_why(recipe: str) -> None:
    """A recipe's scorer scores every answer by a program (hindsight's, the search's, the live
    pass rate); the `feedback` type is the gate's own. Refused when the settings load, naming
    the setting and what to use."""
    plain = {"scorer": {"type": "feedback", "criterion": "answer in one short sentence"}}
    with pytest.raises(RecipeError, match=r"scorer.*a feedback scorer is the gate's own.*regex"):
        load_recipe(recipe, plain)
