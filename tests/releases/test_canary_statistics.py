"""The canary's judge as a statistician: its errors, looking after every report, on seeded
synthetic arms; what counts as one observation, on the real store (SQLite and PostgreSQL); and
on a running `reef serve` (the upstream engine on the loopback OpenAI peer, which is also the
teacher), a score outside the canary's range refused and a teacher's takeover recorded as a
failure of the arm it replaced.

`pytest -s` prints the simulated figures that docs/releases.md quotes."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from reef.config import CanaryConfig
from reef.releases.canary import CANARY_ARM, STABLE_ARM, ArmScores, arm_scores, judge
from reef.store import ExperienceStore, Record, Report
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SEED, TOKEN, peer, write_config

__all__ = ["peer"]  # the loopback OpenAI peer fixture
DEFAULTS = CanaryConfig()  # margin 0.1, confidence 0.95, min_reports 20
STABLE_MEAN = 0.8
CANARIES = 200
REPORTS = 1000  # each canary's deadline, in reports (both arms together)
TOLERANCE = 0.02  # the simulation's own noise: 200 canaries at 5% have a standard error of 1.5%
Draw = Callable[[random.Random, float], float]


def zero_one(rng: random.Random, mean: float) -> float:
    return 1.0 if rng.random() < mean else 0.0


def graded(rng: random.Random, mean: float) -> float:
    """A grader's score in [0, 1]: Beta with this mean, spread like a rubric's (sd about 0.13)."""
    return rng.betavariate(8 * mean, 8 * (1 - mean))


def decided_shares(worse_by: float, draw: Draw, seed: int) -> tuple[float, float]:
    """The shares of simulated canaries promoted and rolled back, each judged after every
    report, sessions split 50/50, undecided ones rolled back at the deadline (not counted)."""
    rng = random.Random(seed)
    decided = {"promote": 0, "rollback": 0, "wait": 0}
    for _ in range(CANARIES):
        arms = {STABLE_ARM: ArmScores.of([]), CANARY_ARM: ArmScores.of([])}
        for _ in range(REPORTS):
            arm = rng.choice((STABLE_ARM, CANARY_ARM))
            mean = STABLE_MEAN - worse_by if arm == CANARY_ARM else STABLE_MEAN
            arms[arm] = arms[arm].adding(draw(rng, mean))
            action = judge(DEFAULTS, arms, age_s=0).action
            if action != "wait":
                break
        decided[action] += 1
    return decided["promote"] / CANARIES, decided["rollback"] / CANARIES


@pytest.mark.parametrize("draw", [zero_one, graded], ids=["0/1 scores", "graded scores"])
def test_a_canary_worse_by_the_margin_is_promoted_at_most_as_often_as_the_confidence_allows(
    draw: Draw,
) -> None:
    margin, error = DEFAULTS.margin, 1 - DEFAULTS.confidence
    promoted, _ = decided_shares(margin, draw, SEED)
    promoted_twice, rolled_back_twice = decided_shares(2 * margin, draw, SEED + 1)
    print(
        f"\n{draw.__name__} scores, stable {STABLE_MEAN}, {CANARIES} canaries of at most "
        f"{REPORTS} reports, judged after each: worse by the margin ({margin}) promoted "
        f"{promoted:.1%}; worse by twice the margin promoted {promoted_twice:.1%}, rolled back "
        f"{rolled_back_twice:.1%}"
    )
    assert promoted <= error + TOLERANCE
    assert promoted_twice <= TOLERANCE
    assert rolled_back_twice >= 0.7  # the guarantee is not bought by never deciding


def test_two_arms_whose_scores_have_not_varied_yet_do_not_decide() -> None:
    settings = CanaryConfig(min_reports=2)
    same = {STABLE_ARM: [1.0, 1.0], CANARY_ARM: [1.0, 1.0]}
    assert judge(settings, same, age_s=0).action == "wait"
    apart = {STABLE_ARM: [1.0, 1.0], CANARY_ARM: [0.0, 0.0]}
    assert judge(settings, apart, age_s=0).action == "wait"
    # Constant arms still decide once there are enough of them.
    many = {STABLE_ARM: [1.0] * 200, CANARY_ARM: [0.0] * 200}
    assert judge(settings, many, age_s=0).action == "rollback"


# -- what counts: the real store -------------------------------------------------------------

CANARY_RELEASE = "default@2"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExperienceStore]:
    if request.param == "postgresql":
        location: Path | str = str(request.getfixturevalue("postgres_url"))
    else:
        location = tmp_path / "experience.db"
    with ExperienceStore(location) as opened:
        yield opened


def routed(
    store: ExperienceStore, arm: str, session: str | None, failed_arm: str | None = None
) -> str:
    """A record the canary's policy routed to `arm` (`teacher`: the teacher took it over)."""
    record = Record(
        scenario="default",
        session=session,
        request={"messages": [{"role": "user", "content": f"hi from {session}"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "hello"}}]},
        engine="teacher" if arm == "teacher" else "upstream",
        release_id=CANARY_RELEASE,
        routing_release_id=CANARY_RELEASE,
        arm=arm,
        failed_arm=failed_arm,
    )
    return store.add_record(record).result()


def report(store: ExperienceStore, references: list[str], score: float) -> None:
    store.add_report(Report(scenario="default", references=references, score=score)).result()


def test_one_report_referencing_many_records_counts_once(store: ExperienceStore) -> None:
    many = [routed(store, CANARY_ARM, f"c{n}") for n in range(50)]
    report(store, many, 0.0)
    report(store, [routed(store, CANARY_ARM, "c-last")], 1.0)
    report(store, [routed(store, STABLE_ARM, "s1")], 1.0)
    arms = arm_scores(store, CANARY_RELEASE, (0.0, 1.0))
    assert (arms[CANARY_ARM].reports, arms[CANARY_ARM].mean) == (2, 0.5)
    assert (arms[STABLE_ARM].reports, arms[STABLE_ARM].mean) == (1, 1.0)


def test_a_session_counts_once_as_the_mean_of_its_reports(store: ExperienceStore) -> None:
    for _ in range(30):  # one busy session, always pleased
        report(store, [routed(store, CANARY_ARM, "busy")], 1.0)
    report(store, [routed(store, CANARY_ARM, "quiet")], 0.0)
    report(store, [routed(store, CANARY_ARM, None)], 0.5)  # no session: a session of its own
    arms = arm_scores(store, CANARY_RELEASE, (0.0, 1.0))
    assert arms[CANARY_ARM].reports == 3 and arms[CANARY_ARM].mean == pytest.approx(0.5)


def test_a_teacher_takeover_counts_as_the_worst_score_of_the_arm_that_failed(
    store: ExperienceStore,
) -> None:
    taken = routed(store, "teacher", "c1", failed_arm=CANARY_ARM)
    report(store, [taken], 1.0)  # the user liked the teacher's answer: not the canary's
    report(store, [routed(store, CANARY_ARM, "c2")], 1.0)
    routed(store, "teacher", "s1")  # a session the teacher answers outright: no arm failed
    report(store, [routed(store, STABLE_ARM, "s2")], 1.0)
    arms = arm_scores(store, CANARY_RELEASE, (-1.0, 1.0))
    assert (arms[CANARY_ARM].reports, arms[CANARY_ARM].mean) == (2, 0.0)  # -1 and 1
    assert (arms[STABLE_ARM].reports, arms[STABLE_ARM].mean) == (1, 1.0)


# -- on a running server ---------------------------------------------------------------------

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
PASSING = "^echo: pass$"  # the teacher's check: the student's answer to "pass" passes it


@pytest.fixture(scope="module")
def canary_server(
    tmp_path_factory: pytest.TempPathFactory, peer: ServerProcess
) -> Iterator[ServerProcess]:
    """A server whose head is a canary at 50%, with a teacher behind the student."""
    project = tmp_path_factory.mktemp("canary")
    write_config(
        project,
        f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n"
        "gate:\n  policy: review\n  canary: {score_range: [0, 5], deadline_s: 3600}\n"
        f"teacher:\n  url: {peer.url}/v1\n  scorer: {{type: regex, pattern: '{PASSING}'}}\n",
    )
    (project / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Hi"}],
        "scorer": {"type": "regex", "pattern": "."},
    }
    (project / "evals" / "default.jsonl").write_text(json.dumps(task) + "\n")
    with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as server:
        stable = harness(project / "stable", "Be kind.")
        reef(project, "release", "publish", str(stable), "--kind", "harness", "--approve")
        new = harness(project / "new", "Be warm.")
        reef(project, "release", "publish", str(new), "--kind", "harness")
        held = json.loads(reef(project, "release", "candidates", "--state", "held", "--json"))
        reef(project, "release", "canary", held[0]["id"], "--share", "50")
        until_routed(server)
        yield server


def reef(project: Path, *args: str) -> str:
    result = run_reef(project, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def until_routed(server: ServerProcess) -> None:
    for _ in range(600):
        if ask(server, "pass", "probe").headers.get("x-reef-arm"):
            return
        time.sleep(0.1)
    raise AssertionError("the canary did not serve")


def ask(server: ServerProcess, question: str, session: str) -> httpx.Response:
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": question}]},
        headers={**HEADERS, "x-reef-session": session},
        timeout=60,
    )
    response.raise_for_status()
    return response


def record_of(server: ServerProcess, response: httpx.Response) -> dict:
    receipt = response.headers["x-reef-agent-record-id"]
    return httpx.get(f"{server.url}/reef/records/{receipt}", headers=HEADERS).json()


def test_a_score_outside_the_canary_range_is_refused_naming_it_and_nothing_is_stored(
    canary_server: ServerProcess,
) -> None:
    answer = ask(canary_server, "pass", "reporter")
    assert answer.headers["x-reef-arm"] in (STABLE_ARM, CANARY_ARM)
    receipt = answer.headers["x-reef-agent-record-id"]
    refused = httpx.post(
        canary_server.url + "/reef/report",
        json={"references": [receipt], "score": -1000},
        headers=HEADERS,
    )
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "outside default's score range [0, 5] (gate.canary.score_range)" in message
    assert record_of(canary_server, answer)["reports"] == []
    within = {"references": [receipt], "score": 5}
    accepted = httpx.post(canary_server.url + "/reef/report", json=within, headers=HEADERS)
    assert accepted.status_code == 201


def test_a_call_the_teacher_took_over_records_the_arm_whose_answer_failed(
    canary_server: ServerProcess,
) -> None:
    seen = {}
    for n in range(16):
        session = f"taught-{n}"
        arm = ask(canary_server, "pass", session).headers["x-reef-arm"]
        taken = ask(canary_server, "fail", session)  # the student's "echo: fail" fails the check
        assert taken.headers["x-reef-arm"] == "teacher"
        record = record_of(canary_server, taken)
        assert (record["arm"], record["engine"]) == ("teacher", "teacher")
        seen[session] = (arm, record["failed_arm"], record["routing_release_id"])
    assert all(arm == failed for arm, failed, _ in seen.values())
    assert {arm for arm, _, _ in seen.values()} == {STABLE_ARM, CANARY_ARM}
    assert {release for _, _, release in seen.values()} == {"default@2"}
