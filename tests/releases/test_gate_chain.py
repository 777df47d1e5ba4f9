"""Decisions that hold along a chain, through the real `reef release publish`: tasks lost count
against the best any release reached, so a chain of small losses stops at the rule's total (and a
rollback or a forced release does not lower the bar); the group rules hold under every policy
that can release; and every arm a routing policy sends sessions to is gated too.

The model is a scripted loopback upstream whose answers follow the harness, so every score is
certain: it answers the correctness task cN right when the system prompt says `know` and not
`forget cN`, and the preference task pN the preferred way when it says `prefer pN`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from typer.testing import CliRunner

from reef.cli import app
from reef.testing.artifacts import harness
from reef.testing.threaded import chat_upstream

CORRECTNESS = [f"c{n}" for n in range(6)]
PREFERENCE = [f"p{n}" for n in range(8)]


def scripted_answer(system: str, question: str) -> str:
    """The answer to a task's question under a system prompt (see the module's docstring)."""
    said = set(system.split())
    task = question.split()[-1].rstrip(".")
    if task.startswith("c"):
        return f"ok-{task}" if "know" in said and f"forget-{task}" not in said else f"no {task}"
    return f"yes-{task}" if f"prefer-{task}" in said else f"meh {task}"


async def completions(request: Request) -> Response:
    body = await request.json()
    messages = body["messages"]
    system = " ".join(m["content"] for m in messages if m["role"] == "system")
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    message = {"role": "assistant", "content": scripted_answer(system, question)}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return JSONResponse(
        {
            "id": "scripted",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [choice],
        }
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with chat_upstream(completions, "scripted", "the scripted model") as url:
        yield url


def project(folder: Path, upstream: str, gate: str) -> Path:
    tasks = [
        {
            "id": task,
            "group": "correctness",
            "messages": [{"role": "user", "content": f"Say the word for {task}."}],
            "scorer": {"type": "contains", "value": f"ok-{task}"},
        }
        for task in CORRECTNESS
    ] + [
        {
            "id": task,
            "group": "preference",
            "messages": [{"role": "user", "content": f"Say something for {task}."}],
            "scorer": {"type": "contains", "value": f"yes-{task}"},
        }
        for task in PREFERENCE
    ]
    (folder / "evals").mkdir(parents=True, exist_ok=True)
    (folder / "evals/default.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    engine = f"engine:\n  kind: upstream\n  upstream:\n    url: {upstream}\n    model: scripted\n"
    (folder / "reef.yaml").write_text(engine + "gate:\n  max_tokens: 16\n" + gate)
    return folder


def agent(folder: Path, forget: int, prefer: int, routing: str | None = None) -> Path:
    """A harness that knows the answers but forgets the first `forget` correctness tasks and
    answers the first `prefer` preference tasks the preferred way."""
    words = ["know"] + [f"forget-{t}" for t in CORRECTNESS[:forget]]
    words += [f"prefer-{t}" for t in PREFERENCE[:prefer]]
    made = harness(folder, " ".join(words))
    if routing is not None:
        (made / "routing.yaml").write_text(routing)
    return made


def reef(root: Path, *args: str) -> tuple[int, str]:
    """`reef ARGS… -c root/reef.yaml`, the real command line in this process (a process of its own
    would spend a second importing Reef, a dozen times a test)."""
    done = CliRunner().invoke(app, [*args, "-c", str(root / "reef.yaml")])
    return done.exit_code, done.stdout


def publish(root: Path, folder: Path, *extra: str) -> dict:
    args = ("release", "publish", str(folder), "--kind", "harness", "--json", *extra)
    code, output = reef(root, *args)
    assert code in (0, 1), output
    return json.loads(output)


def test_a_chain_of_single_losses_stops_at_the_rules_total(upstream: str, tmp_path: Path) -> None:
    """Each candidate loses one more correctness task than the release before it, and wins two
    preference tasks: against the predecessor each loses one, but against the best released the
    losses add up, and the chain stops once they pass `max_lost`."""
    root = project(tmp_path, upstream, "  groups:\n    correctness: {rule: keep, max_lost: 2}\n")
    first = publish(root, agent(tmp_path / "a0", forget=0, prefer=0))
    assert first["state"] == "released", first["decision"]
    states = []
    for step in range(1, 5):
        candidate = publish(root, agent(tmp_path / f"a{step}", forget=step, prefer=2 * step))
        assert candidate["evaluation"]["candidate_mean"] > candidate["evaluation"]["current_mean"]
        states.append(candidate["state"])
        if step == 3:
            stopped = candidate
    assert states == ["released", "released", "rejected", "rejected"]
    assert (
        "lost 3 task(s) of group correctness against the best released (at most 2 may be): "
        "c0 (8/8 -> 0/8), c1 (8/8 -> 0/8), c2 (8/8 -> 0/8)"
    ) in stopped["decision"]
    assert stopped["evaluation"]["lost"] == ["c0", "c1", "c2"]
    c0 = next(r for r in stopped["evaluation"]["results"] if r["task_id"] == "c0")
    assert (c0["current_score"], c0["reference_score"]) == (0.0, 1.0)  # the head had lost it


def test_a_forced_release_and_rollbacks_do_not_lower_the_bar(upstream: str, tmp_path: Path) -> None:
    """A release published past the gate that forgot two tasks, then rolled back to and back
    again: the next candidate is still held to the best released, not to the head."""
    root = project(tmp_path, upstream, "")
    assert publish(root, agent(tmp_path / "a0", forget=0, prefer=0))["state"] == "released"
    forced = publish(root, agent(tmp_path / "forced", forget=2, prefer=0), "--approve")
    assert forced["release_id"] == "default@2"
    for target in ("default@1", "default@2"):
        code, output = reef(root, "release", "rollback", "--to", target)
        assert code == 0, output
    candidate = publish(root, agent(tmp_path / "next", forget=2, prefer=3))
    assert candidate["evaluation"]["current_release_id"] == "default@4"  # a copy of default@2
    assert candidate["state"] == "rejected"
    assert (
        "lost 2 task(s) of group correctness against the best released: "
        "c0 (8/8 -> 0/8), c1 (8/8 -> 0/8)"
    ) in candidate["decision"]


def test_an_edited_task_is_a_new_task(upstream: str, tmp_path: Path) -> None:
    """The best released is kept per task and per what it asks: a task whose question or scorer
    changed starts again from the current release's score."""
    root = project(tmp_path, upstream, "")
    assert publish(root, agent(tmp_path / "a0", forget=0, prefer=0))["state"] == "released"
    publish(root, agent(tmp_path / "forced", forget=1, prefer=0), "--approve")
    refused = publish(root, agent(tmp_path / "a1", forget=1, prefer=2))
    assert refused["state"] == "rejected" and "c0 (8/8 -> 0/8)" in refused["decision"]
    evals = root / "evals/default.jsonl"
    evals.write_text(evals.read_text().replace("Say the word for c0.", "Now say the word for c0."))
    released = publish(root, agent(tmp_path / "a2", forget=1, prefer=2))
    assert released["state"] == "released", released["decision"]


BROKEN_RULE = "lost 2 task(s) of group correctness against the best released (at most 1 may be)"


@pytest.mark.parametrize(
    ("policy", "would_have_been"),
    [
        ("no_regression", "rejected"),
        ("improve", "released"),
        ("floor", "released"),
        ("canary", "canary"),
    ],
)
def test_every_policy_that_can_release_keeps_the_group_rules(
    upstream: str, tmp_path: Path, policy: str, would_have_been: str
) -> None:
    """A candidate that wins five preference tasks by losing two correctness tasks of the
    first release's: a better mean, above the floor, and refused under every policy."""
    rules = "  groups:\n    correctness: {rule: keep, max_lost: 1}\n"
    root = project(tmp_path, upstream, f"  policy: {policy}\n  floor: 0.3\n{rules}")
    first = publish(root, agent(tmp_path / "a0", forget=0, prefer=0), "--approve")
    assert first["state"] == "released"
    trade = publish(root, agent(tmp_path / "trade", forget=2, prefer=5))
    assert trade["evaluation"]["candidate_mean"] > trade["evaluation"]["current_mean"]
    assert trade["state"] == "rejected", (would_have_been, trade["decision"])
    assert BROKEN_RULE in trade["decision"]
    fair = publish(root, agent(tmp_path / "fair", forget=1, prefer=5))
    assert fair["state"] == ("canary" if policy == "canary" else "released"), fair["decision"]


def test_review_names_the_broken_rule_and_holds(upstream: str, tmp_path: Path) -> None:
    root = project(tmp_path, upstream, "  policy: review\n")
    publish(root, agent(tmp_path / "a0", forget=0, prefer=0), "--approve")
    held = publish(root, agent(tmp_path / "trade", forget=2, prefer=5))
    assert held["state"] == "held"
    assert "lost 2 task(s) of group correctness against the best released" in held["decision"]


ALL_TO = "routes:\n  - arms:\n      - {{name: old, release: {release}, share: 100}}\n"
SPLIT = (
    "routes:\n  - arms:\n      - {name: stable, release: default@1, share: 90}\n"
    "      - {name: new, release: self, share: 10}\n"
)


def test_a_policy_routing_sessions_to_a_worse_release_is_refused(
    upstream: str, tmp_path: Path
) -> None:
    """The candidate's own parts win, but its routing sends every session to the model alone
    (or to an older release that forgot two tasks): each arm is evaluated on the scenario's
    tasks and held to the same rules, so it is refused, naming the arm."""
    root = project(tmp_path, upstream, "")
    publish(root, agent(tmp_path / "a0", forget=0, prefer=0))
    publish(root, agent(tmp_path / "weak", forget=2, prefer=0), "--approve")  # default@2
    publish(root, agent(tmp_path / "a1", forget=0, prefer=0), "--approve")  # default@3
    for worse, lost in (("base", "lost 6 task(s)"), ("default@2", "lost 2 task(s)")):
        routed = agent(tmp_path / f"to-{worse}", 0, 4, ALL_TO.format(release=worse))
        candidate = publish(root, routed)
        assert candidate["evaluation"]["candidate_mean"] > candidate["evaluation"]["current_mean"]
        assert candidate["state"] == "rejected", candidate["decision"]
        assert (
            f"routed arm old ({worse}, 100%): {lost} of group correctness"
            in (candidate["decision"])
        )
        arm = candidate["evaluation"]["arms"][0]
        assert (arm["name"], arm["release"], arm["lost"][:2]) == ("old", worse, ["c0", "c1"])
    split = publish(root, agent(tmp_path / "split", 0, 4, SPLIT))
    assert split["state"] == "released", split["decision"]
    assert re.search(r"routed arm stable \(default@1, 90%\) keeps the rules", split["decision"])
