"""The preferences a scripted user teaches, the recipes set up to learn them, and one run of a
preference x recipe round by round (`run`): what `bench.learning.preferences` measures, and
`bench.learning.feedback_latency` and `bench.learning.harness_episodes` reuse."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common.taught import TAUGHT, Table
from reef.evaluation.facts import wrong_claims
from reef.protocol import response_text
from reef.sdk.hindsight import answers_the_question, with_hint
from reef.sdk.view import Turn
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
)


@dataclass(frozen=True)
class Preference:
    name: str
    feedback: str  # what the scripted user says, once, on each miss
    pattern: str  # what an answer that meets it looks like
    parts: tuple[Preference, ...] = ()  # a pair: both must be met
    phrasing: str = "quoted"  # how the feedback says it (`PHRASINGS`)

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

# Each preference as people say it: the quoted form above, and four more. `next-turn` is said
# as the user's next message, not in a report.
PHRASINGS: dict[str, dict[str, str]] = {
    "sure": {
        "plain": "please begin every reply with the word sure and an exclamation mark",
        "complaint": "you sound so cold, I want a friendly sure! before anything else",
        "question": "could you open your answers by saying sure! first?",
        "next-turn": "ok but next time start with sure! when you reply",
    },
    "short": {
        "plain": "keep it to a handful of words at most",
        "complaint": "way too wordy, I only needed a few words",
        "question": "can you say that in five words or less?",
        "next-turn": "too long for me, just give me a few words next time",
    },
    "sign-off": {
        "plain": "finish each answer by signing it Cheers, Reef on its own line",
        "complaint": "you never sign off, I want Cheers, Reef at the end",
        "question": "would you close every reply with Cheers, Reef?",
        "next-turn": "thanks, and please sign your answers with Cheers, Reef from now on",
    },
    "bullet": {
        "plain": "put the answer in a single bullet point that starts with a dash",
        "complaint": "a wall of text again, I want one dash bullet point",
        "question": "could you give it to me as a bullet point starting with a dash?",
        "next-turn": "next time write it as one bullet point with a dash in front",
    },
    "french": {
        "plain": "reply in french from now on",
        "complaint": "I can't read english well, I need answers in french",
        "question": "can you answer me in french please?",
        "next-turn": "en français s'il vous plaît, answer me in french",
    },
}
NEXT_TURN = "next-turn"


def phrased(preference: Preference, phrasing: str) -> Preference:
    """`preference` with its feedback said another way (`quoted`: as written above)."""
    if phrasing == "quoted":
        return preference
    feedback = PHRASINGS[preference.name][phrasing]
    name = f"{preference.name}/{phrasing}"
    return Preference(name, feedback, preference.pattern, preference.parts, phrasing)


# Batches of 4: of the 6 training prompts, 2 are held out for the gate (gate.held_out, by the
# prompt's words: the capital of France and the sky's colour), so 4 failing calls are learnable.
SFT = {"recipe": "sft", "batch_size": 4, "steps": 30, "max_tokens": 48}
# sft replaying more of what the model already does (its answers to other questions, cut ones
# too) beside the preference's examples: does it forget less?
SFT_REPLAY = {**SFT, "replay": 12, "replay_cut_answers": True}
# sft on one torch thread, as it trained before `threads: auto` (the baseline of that change).
SFT_ONE_THREAD = {**SFT, "threads": 1}
# Fewer, larger steps: 12 at 2.5x the learning rate (steps x rate as in sft's 30).
SFT_FEW_STEPS = {**SFT, "steps": 12, "learning_rate": 1.25e-3}
HARNESS_EVOLVE = {"recipe": "harness_evolve", "proposer": "hindsight", "batch_size": 3}
# The weight recipes that learn without a scorer: from the hint in the teacher's context (sdft),
# or from the scores alone (sao: one step per scored rollout).
# A round asks 6 prompts, and a prompt whose answer already meets the preference carries no
# feedback: the distillation recipes step on what a round's misses can fill (the base answers one
# prompt in French already; with 6, sdft and sdpo waited for a turn that never came).
SDFT = {"recipe": "sdft", "batch_size": 4, "steps": 16}
SAO = {"recipe": "sao", "batch_size": 1, "max_staleness": 18}
# From the model's own correct attempts: sdpo needs siblings, so its user samples each training
# prompt ATTEMPTS times (temperature 1, a seed each) and scores every attempt.
SDPO = {"recipe": "sdpo", "batch_size": 3, "steps": 8}
ATTEMPTS = {"sdpo": 4}
# GEPA on the same budget of metric calls a harness_evolve step's gate spends on its own tasks.
GEPA = {"recipe": "gepa", "batch_size": 4, "max_metric_calls": 48, "minibatch_size": 3}
META_HARNESS = {"recipe": "meta_harness", "batch_size": 4, "max_nodes": 6}
SKILLS = {"recipe": "skills", "batch_size": 4}
RECIPES = {
    "sft": [SFT],
    "sft_replay": [SFT_REPLAY],
    "sft_one_thread": [SFT_ONE_THREAD],
    "sft_few_steps": [SFT_FEW_STEPS],
    "harness_evolve": [HARNESS_EVOLVE],
    "both": [HARNESS_EVOLVE, SFT],
    "sdft": [SDFT],
    "sao": [SAO],
    "sdpo": [SDPO],
    "gepa": [GEPA],
    "meta_harness": [META_HARNESS],
    "skills": [SKILLS],
}
# The recipes that take the preference's scorer.
SCORED = {"sft", "harness_evolve", "gepa", "meta_harness", "skills"}
TOKENS = 32  # max_tokens of every answer measured, and of the gate's


# How a preference reaches the learner (`--paths`): the recipe alone, from the feedback; a
# stronger reviser (`reviser: proposer`, the proposer being the taught model), which with
# `judged` also judges whether a rewrite still answers (`content_check: proposer`); the scenario's
# `teacher:` (the taught model answers the calls whose answer misses, and the report on such a
# call carries its answer as a demonstration); or the user's own answer, a demonstration in the
# report. The taught model is `bench.common.taught`'s table (the only model here is the 135M one).
PATHS = ["alone", "reviser", "judged", "teacher", "demonstration"]
REVISED = {
    "reviser": {"reviser": "proposer"},
    "judged": {"reviser": "proposer", "content_check": "proposer"},
}


def project(
    folder: Path,
    preference: Preference,
    recipe: str,
    policy: str,
    path: str = "alone",
    taught_url: str | None = None,
    prefill: str = "auto",
) -> Path:
    """A project serving the embedded model as a user's does (`prefill`: which weights read
    prompts, `engine.llamacpp.prefill_weights`; auto is the server's default)."""
    (folder / "evals").mkdir(parents=True)
    preference_tasks = "".join(
        eval_tasks(EVALS[:3], pattern, group="preference") for pattern in preference.task_patterns
    )
    (folder / "evals/default.jsonl").write_text(correctness_tasks() + preference_tasks)
    (folder / "reef.yaml").write_text(
        f"engine:\n  llamacpp: {{n_ctx: 1024, n_threads: 2, prefill_weights: {prefill}}}\n"
        f"gate:\n  policy: {policy}\n  max_tokens: {TOKENS}\n"
        "  groups: {default: {max_lost: 1}}\n"
        f"learning: {json.dumps(learning(preference, recipe, path, taught_url))}\n"
        + (teacher(preference, taught_url) if path == "teacher" else "")
    )
    return folder


def teacher(preference: Preference, url: str | None) -> str:
    """The `teacher` section: the taught model answers a call whose answer misses."""
    scorer = {"type": "regex", "pattern": preference.progress}
    return f"teacher: {json.dumps({'url': url, 'scorer': scorer})}\n"


def learning(
    preference: Preference, recipe: str, path: str = "alone", taught_url: str | None = None
) -> dict:
    """The `learning` section: the recipe(s), each accepting answers by the preference; on the
    `reviser` path, `sft` and `harness_evolve` revise with the proposer, the taught model; on the
    `judged` path, the proposer also judges whether a rewrite still answers."""
    scorer = {"type": "regex", "pattern": preference.progress}
    recipes = [
        {**settings, "scorer": scorer} if settings["recipe"] in SCORED else settings
        for settings in RECIPES[recipe]
    ]
    if path in REVISED:
        revising = {"sft", "harness_evolve"}  # the recipes with `reviser` and `content_check`
        recipes = [{**r, **REVISED[path]} if r["recipe"] in revising else r for r in recipes]
    chosen = {"recipes": recipes} if len(recipes) > 1 else recipes[0]
    proposer = {"proposer_url": taught_url, "proposer_model": "taught"} if path in REVISED else {}
    return {"interval_s": 0.5, **proposer, **chosen}


# The held-out prompts whose right answer a pattern can check, in English or in French (a number
# as digits or as a word). The others ("Name a bird.") take any answer of their kind.
RIGHT = {
    "What is 5+5?": r"(?i)\b(10|ten|dix)\b",
    "What is the capital of Italy?": r"(?i)\brome\b",
    "What is the tallest mountain?": r"(?i)\beverest\b",
    "What is 10 minus 3?": r"(?i)\b(7|seven|sept)\b",
    "What language is spoken in Brazil?": r"(?i)\b(portuguese|portugais)\b",
}
assert set(RIGHT) <= set(HELD_OUT), "every prompt RIGHT checks is a held-out prompt"


def held_out_rates(url: str, preference: Preference) -> tuple[float, float, dict[str, str]]:
    """The held-out pass rate for the preference; the share of the prompts in `RIGHT` whose
    answer meets the preference and is right ("Four." to "What is 5+5?" meets "short" and is
    wrong); and the answers, by prompt, to read."""
    replies = {prompt: ask(url, prompt, TOKENS, capture=False) for prompt in HELD_OUT}
    meeting = {prompt for prompt, reply in replies.items() if meets(reply, preference.pattern)}
    right = [
        prompt for prompt in RIGHT if prompt in meeting and meets(replies[prompt], RIGHT[prompt])
    ]
    answers = {prompt: response_text(reply.json()) for prompt, reply in replies.items()}
    return len(meeting) / len(HELD_OUT), len(right) / len(RIGHT), answers


def told_rates(url: str, preference: Preference) -> tuple[float, float]:
    """Whether the model follows the preference when told: the share of training prompts whose
    greedy answer meets it with the feedback beside the question, as the learner's hint puts it
    (`with_hint`), and the share that also still answers the question, as hindsight checks it
    (`answers_the_question`, against the base's own answer without the feedback); not
    recorded."""
    meets_it = answering = 0
    for prompt in TRAINING:
        question = [{"role": "user", "content": prompt}]
        first = _greedy(url, question)
        told = _greedy(url, with_hint(question, preference.feedback))
        hit = meets(told, preference.pattern)
        turn = Turn("told", question, told_message(first), "base")
        # (At TOKENS the engine never ends an answer for looping: it needs 64 repeated tokens.)
        still = answers_the_question(told_message(told)["content"], turn, preference.feedback)
        meets_it += hit
        answering += hit and still
    return meets_it / len(TRAINING), answering / len(TRAINING)


def _greedy(url: str, messages: list[dict]) -> httpx.Response:
    body = {"messages": messages, "max_tokens": TOKENS, "temperature": 0}
    headers = {"x-reef-capture": "false"}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    response.raise_for_status()
    return response


def told_message(response: httpx.Response) -> dict:
    return response.json()["choices"][0]["message"]


def metric_calls_so_far(url: str) -> int:
    """The metric calls of every recipe's steps on the scenario so far: the answers each step
    asked for to score, its search's and its gate's."""
    status = httpx.get(f"{url}/reef/status").json()["learning"]["scenarios"].get("default", {})
    return sum(found.get("metric_calls", 0) for found in status.get("recipes", {}).values())


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


def serving(url: str) -> str:
    """The release the scenario serves now."""
    return str(httpx.get(f"{url}/reef/status").json()["serving"].get("default", "base"))


def await_swap(url: str, served: str, timeout: float = 120) -> None:
    """Wait until a release other than `served` serves: a step's release is decided before the
    engine swaps to it, and a measurement taken between the two reads the old release. Past
    `timeout`, say so and go on (the row's `release` shows what served)."""
    deadline = time.monotonic() + timeout
    while serving(url) == served:
        if time.monotonic() > deadline:
            print(f"a release was decided, and {served} still serves after {timeout} s", flush=True)
            return
        time.sleep(1)


def latest_decided(server: ServerProcess) -> dict:
    listed = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    return next((c for c in listed if c["state"] in ("released", "rejected")), {})


def a_round(
    server: ServerProcess,
    preference: Preference,
    number: int,
    path: str = "alone",
    attempts: int = 1,
) -> int:
    """The scripted user asks every training prompt and scores the answer; how many missed.
    A `next-turn` user says what it wants in its next message of the session instead; on the
    `demonstration` path, the user writes the answer it wanted (from `bench.common.taught`'s table).
    An answer the teacher gave counts as a miss of the student's. With `attempts` > 1 each
    prompt is sampled that many times (siblings) and each attempt is scored."""
    misses = 0
    for index, prompt in enumerate(TRAINING * attempts):
        session = f"round{number}-{index % len(TRAINING)}"
        seed = None if attempts == 1 else index // len(TRAINING)
        response = ask_in(server.url, prompt, session, seed)
        hit = meets(response, preference.pattern)
        answer = response.json()["choices"][0]["message"]["content"] or ""
        said = {} if hit else {"feedback": preference.feedback_on(answer)}
        if said and path == "demonstration":
            said = {"feedback": {"demonstration": TAUGHT[preference.name.split("/")[0]][prompt]}}
        elif said and preference.phrasing == NEXT_TURN:
            follow_up(server.url, prompt, answer, said.pop("feedback"), session)
        report = {
            "references": [response.headers["x-reef-agent-record-id"]],
            "score": 1 if hit else 0,
            **said,
        }
        httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
        misses += not hit or response.headers.get("x-reef-arm") == "teacher"
    return misses


def ask_in(url: str, prompt: str, session: str, seed: int | None = None) -> httpx.Response:
    """One answer to `prompt`, recorded in `session`: greedy, or sampled with `seed`."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS}
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    headers = {"x-reef-session": session}
    response = httpx.post(
        f"{url}/v1/chat/completions", json={**body, **sampling}, headers=headers, timeout=600
    )
    response.raise_for_status()
    return response


def follow_up(url: str, prompt: str, answer: str, message: str, session: str) -> None:
    """The user's next message in the session, after the answer it did not like."""
    messages = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": message},
    ]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    headers = {"x-reef-session": session}
    httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)


def run(
    preference: Preference,
    recipe: str,
    policy: str,
    rounds: int,
    budget: float,
    path: str = "alone",
    taught: tuple[Table, str] | None = None,
    metric_calls: int | None = None,
    src: Path | None = None,
    prefill: str = "auto",
) -> dict:
    """One run from the base; with `taught`, the taught model's table and URL, which answers
    only while the user trains (never while the student is measured). With `metric_calls`, the
    rounds go on (up to `rounds`) until the recipe's steps have spent that many, and the held-out
    pass rate is measured after each round: the run's `curve`, (metric calls, pass rate). With
    `src`, the server runs another source tree of Reef (a baseline: `PYTHONPATH` put first)."""
    table, taught_url = taught if taught else (Table(answering=False), None)
    table.preference, table.answering = preference.name.split("/")[0], False
    folder = Path(tempfile.mkdtemp(prefix="reef-pref-"))
    project(folder, preference, recipe, policy, path, taught_url, prefill)
    decisions = []
    env = {**os.environ, "PYTHONPATH": str(src)} if src else None
    with reef_serve(folder, free_port(), env=env).start() as server:
        before, right_before, _ = held_out_rates(server.url, preference)
        knew = correct(server.url, TOKENS)
        told, told_answering = told_rates(server.url, preference)
        started = time.monotonic()
        round_seconds = []
        curve = [(0, before)]
        for number in range(rounds):
            round_started = time.monotonic()
            before_round, served = steps_so_far(server.url), serving(server.url)
            table.answering = True
            missed = a_round(server, preference, number, path, ATTEMPTS.get(recipe, 1))
            if not missed:
                decisions.append("no misses")  # nothing left to learn from
                break
            outcomes = next_steps(server.url, before_round, len(RECIPES[recipe]), budget)
            decisions.append("+".join(outcomes) or "no step")  # the recipe was never ready
            if any(outcome.endswith(":released") for outcome in outcomes):
                await_swap(server.url, served)
            round_seconds.append(round(time.monotonic() - round_started))
            if metric_calls is not None:
                spent = metric_calls_so_far(server.url)
                curve.append((spent, held_out_rates(server.url, preference)[0]))
                if spent >= metric_calls:
                    break
            if not outcomes or time.monotonic() - started > rounds * budget:
                break
        table.answering = False
        release = serving(server.url)
        harness = httpx.get(f"{server.url}/reef/harness").json()
        parts = harness["parts"]
        examples = examples_of(harness["files"].get("examples.jsonl") or "")
        after, right_after, answers = held_out_rates(server.url, preference)
        knows = correct(server.url, TOKENS)
        last = latest_decided(server)
        spent = metric_calls_so_far(server.url)
    return {
        "preference": preference.name,
        "phrasing": preference.phrasing,
        "recipe": recipe,
        "policy": policy,
        "path": path,
        "prefill": prefill,
        "told": told,
        "told_answering": told_answering,
        "before": before,
        "after": after,
        "right_before": right_before,  # of RIGHT's prompts: meets the preference, and is right
        "right_after": right_after,
        "held_out_answers": answers,  # what serves at the end says to each held-out prompt
        "correct_before": len(knew),
        "correct_after": len(knows),
        "forgot": sorted(set(knew) - set(knows)),
        "release": release,
        "parts": parts,
        "decisions": decisions,
        "last_decision": last.get("decision", ""),
        "seconds": round(time.monotonic() - started),
        "round_seconds": round_seconds,
        "metric_calls": spent,
        "curve": curve,
        "examples": examples,  # the worked examples that serve at the end
        "wrong_facts": [e for e in examples if wrong_example(e)],
    }


# The training prompts whose right answer a pattern can check (an example that answers one of
# them and misses it teaches a wrong fact), beside the held-out ones of `RIGHT`.
TRAINING_RIGHT = {
    "What is the capital of France?": r"(?i)\bparis\b",
    "What is 2+2?": r"(?i)\b(4|four|quatre)\b",
    "What colour is the sky?": r"(?i)\b(blue|bleu)\b",
    "What is the largest ocean?": r"(?i)\b(pacific|pacifique)\b",
}


def examples_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wrong_example(example: dict) -> bool:
    """Whether a worked example teaches a wrong fact: it answers a prompt whose right answer a
    pattern checks and misses it, or it states arithmetic that does not hold."""
    question, answer = str(example.get("user", "")), str(example.get("assistant", ""))
    pattern = TRAINING_RIGHT.get(question) or RIGHT.get(question)
    if pattern and not re.search(pattern, answer):
        return True
    return bool(wrong_claims(answer))
