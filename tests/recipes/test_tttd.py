"""tttd: the verifier on known packings, the adaptive β and entropic advantages against hand
computations, PUCT on a hand-built archive, and one step on the embedded model."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
from reef.recipes.tttd import circles
from reef.recipes.tttd.advantages import adaptive_beta, entropic_advantages, kl_from_uniform
from reef.recipes.tttd.archive import Archive
from reef.recipes.tttd.circles import Circle, InvalidPacking, verify

from reef.testing.processes import free_port, reef_serve

# -- the verifier ----------------------------------------------------------------------------------


def test_a_valid_packing_scores_the_sum_of_its_radii() -> None:
    four = [Circle(x, y, 0.25) for x in (0.25, 0.75) for y in (0.25, 0.75)]
    assert verify(four) == pytest.approx(1.0)


def test_touching_circles_within_the_tolerance_are_valid() -> None:
    # Two circles of radius 0.25 whose centres are 0.5 - 5e-10 apart overlap by 5e-10 < 1e-9.
    touching = [Circle(0.25, 0.5, 0.25), Circle(0.75 - 5e-10, 0.5, 0.25)]
    assert verify(touching) == pytest.approx(0.5)


def test_a_circle_just_outside_the_square_is_rejected() -> None:
    with pytest.raises(InvalidPacking, match=r"circle 0 .* leaves the square"):
        verify([Circle(0.25, 0.5, 0.25 + 1e-6)])
    with pytest.raises(InvalidPacking, match="leaves the square"):
        verify([Circle(0.9, 0.5, 0.1 + 2e-9)])


def test_an_overlap_of_a_millionth_is_rejected() -> None:
    overlapping = [Circle(0.25, 0.5, 0.25), Circle(0.75 - 1e-6, 0.5, 0.25)]
    with pytest.raises(InvalidPacking, match="circles 0 and 1 overlap by 1e-06"):
        verify(overlapping)


def test_a_negative_radius_is_rejected() -> None:
    with pytest.raises(InvalidPacking, match="radius"):
        verify([Circle(0.5, 0.5, -0.1)])


def test_grown_circles_are_always_a_valid_packing() -> None:
    state = circles.starting_state(26, seed=3)
    grown = circles.grown(state)
    assert verify(grown) == pytest.approx(sum(c.r for c in grown))
    # The first circle grows to the nearest side; a circle on an earlier centre gets nothing.
    assert circles.grown([(0.3, 0.5), (0.3, 0.5)])[1].r == 0.0
    assert circles.grown([(0.3, 0.5)])[0].r == pytest.approx(0.3)


def test_an_answers_numbers_in_the_square_are_read_in_pairs_as_centres_in_order() -> None:
    state = [(0.1, 0.1), (0.2, 0.2), (0.3, 0.3), (0.4, 0.4)]
    answer = "Here you go (v2):\n0.5 0.5\n1.7 0.2\n0.25, 0.75 and -0.3 = .9\n"
    # 2 is part of a word, 1.7 and -0.3 are outside the square: 0.5 0.5 0.2 0.25 0.75 .9 remain.
    assert circles.parse_centres(answer, state) == [
        (0.5, 0.5),
        (0.2, 0.25),
        (0.75, 0.9),
        (0.4, 0.4),
    ]
    assert circles.parse_centres("no numbers", state) == state


def test_the_gate_scorer_reads_the_state_from_the_prompt() -> None:
    state = circles.starting_state(26)
    prompt = circles.prompt(state)
    assert circles.state_in_prompt(prompt) == state

    class Task:
        def __init__(self) -> None:
            self.messages = [{"role": "user", "content": prompt}]

    echoed = "\n".join(f"{x} {y}" for x, y in state)
    assert circles.score_answer(echoed, Task()) == pytest.approx(
        circles.reward(state) / circles.BEST_KNOWN[26]
    )


def test_without_a_known_best_the_gate_scorer_divides_by_the_area_bound() -> None:
    state = circles.starting_state(5)

    class Task:
        def __init__(self) -> None:
            self.messages = [{"role": "user", "content": circles.prompt(state)}]

    score = circles.score_answer("", Task())
    assert score == pytest.approx(circles.reward(state) / math.sqrt(5 / math.pi))


# -- entropic advantages ---------------------------------------------------------------------------


@pytest.mark.parametrize("rewards", [[0.1, 0.5, 0.9], [1.0, 1.2, 1.25, 2.0], [3.0, 3.0, 2.0, 1.0]])
def test_beta_puts_the_weights_at_kl_ln2_from_uniform(rewards: list[float]) -> None:
    beta = adaptive_beta(rewards)
    assert kl_from_uniform(rewards, beta) == pytest.approx(math.log(2), abs=1e-6)


def test_the_entropic_advantages_match_a_hand_computation() -> None:
    rewards = [0.0, 1.0, 2.0]
    (advantages, beta) = entropic_advantages(rewards) or ([], 0.0)
    e = [math.exp(beta * r) for r in rewards]
    # Leave-one-out: w_i = e_i / mean of the others' e_j; A_i = w_i - 1.
    expected = [e[0] / ((e[1] + e[2]) / 2) - 1, e[1] / ((e[0] + e[2]) / 2) - 1]
    expected.append(e[2] / ((e[0] + e[1]) / 2) - 1)
    assert advantages == pytest.approx(expected)
    assert advantages[0] < 0 < advantages[2]


def test_a_group_with_equal_rewards_has_no_advantages() -> None:
    assert entropic_advantages([1.5, 1.5, 1.5]) is None
    with pytest.raises(ValueError, match="equal"):
        adaptive_beta([2.0, 2.0, 2.0])


def test_an_unreachable_target_caps_beta_and_the_best_share_the_weight() -> None:
    # Three of four rollouts share the best reward: the KL only tends to ln(4/3) < ln 2.
    advantages, beta = entropic_advantages([0.0, 1.0, 1.0, 1.0]) or ([], 0.0)
    assert beta == pytest.approx(1e6)
    # w_best = e / ((e + e + 0) / 3) = 3/2, w_worst = 0.
    assert advantages == pytest.approx([-1.0, 0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="at least 3 rollouts"):
        entropic_advantages([0.0, 1.0])


# -- the archive -----------------------------------------------------------------------------------


def test_puct_scores_match_a_hand_computation() -> None:
    archive = Archive(capacity=8, exploration=1.0)
    a = archive.add([[0.1, 0.1]], 1.0)
    b = archive.add([[0.2, 0.2]], 2.0)
    c = archive.add([[0.3, 0.3]], 1.5)
    archive.expanded(b.id, [2.2, 1.9])  # b expanded once, best child 2.2
    scores = archive.puct_scores()
    # Reached: a 1.0, b 2.2, c 1.5 -> Q scaled over [1.0, 2.2]. Ranks by reward: b, c, a.
    # Priors 3/6, 2/6, 1/6; T = 1, so sqrt(1 + T) = sqrt(2).
    root = math.sqrt(2)
    assert scores[b.id] == pytest.approx(1.0 + 0.5 * root / 2)
    assert scores[c.id] == pytest.approx(0.5 / 1.2 + (2 / 6) * root)
    assert scores[a.id] == pytest.approx(0.0 + (1 / 6) * root)
    assert [s.id for s in archive.choose(2)] == [b.id, c.id]


def test_an_often_expanded_state_gives_way_to_an_unexplored_one() -> None:
    archive = Archive(capacity=8, exploration=2.0)
    best = archive.add([[0.1, 0.1]], 2.0)
    other = archive.add([[0.2, 0.2]], 1.9)
    for _ in range(6):
        archive.expanded(best.id, [1.95])  # its children never beat it
    assert archive.choose(1)[0].id == other.id


def test_the_archive_keeps_its_best_states_and_survives_a_save(tmp_path: Path) -> None:
    archive = Archive(capacity=2)
    for reward in (1.0, 3.0, 2.0):
        archive.add([[reward / 10, 0.5]], reward)
    assert [s.reward for s in archive.states] == [3.0, 2.0]
    archive.save(tmp_path / "archive.json")
    loaded = Archive.load(tmp_path / "archive.json")
    assert loaded == archive


# -- through the whole loop -----------------------------------------------------------------------

CONFIG = """
engine:
  llamacpp: {n_ctx: 1024, n_threads: 2}
gate:
  policy: floor
  floor: 0.0
  max_tokens: 200
learning:
  recipe: tttd
  interval_s: 0.5
  starts: 1
  group_size: 4
  max_tokens: 200
  steps: 1
"""


@pytest.mark.slow
def test_one_discovery_step_verifies_rollouts_trains_and_releases(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(CONFIG)
    server = reef_serve(tmp_path, free_port())
    with server.start():
        started = time.monotonic()
        while not released(server.url):
            status = httpx.get(f"{server.url}/reef/status").json()
            last = status["learning"]["scenarios"].get("default", {}).get("last_step", {})
            assert last.get("outcome") not in ("rejected", "error"), (last, server.log()[-3000:])
            assert time.monotonic() - started < 900, server.log()[-3000:]
            time.sleep(2)
        candidates = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    archive = Archive.load(tmp_path / ".reef/learning/tttd/archive.json")
    first = archive.history[0]
    start = circles.starting_state(26)
    assert first["groups"][0]["start"] == 0 and len(first["groups"][0]["rewards"]) == 4
    # Every reward is what the verifier gives the packing the archive kept for it.
    for state in archive.states:
        centres = [(x, y) for x, y in state.centres]
        assert state.reward == pytest.approx(verify(circles.grown(centres)))
    assert len(archive.states) > 1  # the rollouts entered the archive beside the start
    assert first["best"] == pytest.approx(
        max([circles.reward(start), *first["groups"][0]["rewards"]])
    )
    assert (tmp_path / ".reef/learning/tttd/best.png").stat().st_size > 1000
    released_candidate = next(c for c in candidates if c["state"] == "released")
    assert released_candidate["kind"] == "lora"
    # Released by the step that learned: one whose group had rewards to tell apart. A step
    # whose rollouts all scored alike (possible on any machine) proposed nothing, and the next
    # step went on from the archive it left.
    assert released_candidate["metrics"]["step"] == len(archive.history)
    assert all(h["skipped_groups"] == len(h["groups"]) for h in archive.history[:-1])
    assert archive.history[-1]["skipped_groups"] < len(archive.history[-1]["groups"])


def released(url: str) -> bool:
    status = httpx.get(f"{url}/reef/status").json()
    return status["serving"].get("default", "base") != "base"
