"""tttd: the verifier on known packings, the adaptive β and entropic advantages against hand
computations, PUCT on a hand-built archive, and one step on the embedded model."""

from __future__ import annotations

import json
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
    # Q: b its best child 2.2; a 1.0 and c 1.5 unexpanded, their own rewards. Measured over the
    # rewards' span [1.0, 2.0]: b 1.2, c 0.5, a 0.0. Ranks by reward b, c, a: priors 3/6, 2/6,
    # 1/6. T = 1: sqrt(2). n: b 1, a and c 0.
    root = math.sqrt(2)
    assert scores[b.id] == pytest.approx(1.2 + 0.5 * root / 2)  # 1.5536
    assert scores[c.id] == pytest.approx(0.5 + (2 / 6) * root)  # 0.9714
    assert scores[a.id] == pytest.approx(0.0 + (1 / 6) * root)  # 0.2357
    assert [s.id for s in archive.choose(2)] == [b.id, c.id]


def test_an_expanded_states_q_is_its_best_child_even_below_its_own_reward() -> None:
    archive = Archive(capacity=8, exploration=1.0)
    a = archive.add([[0.1, 0.1]], 1.0)
    b = archive.add([[0.2, 0.2]], 2.0)
    c = archive.add([[0.3, 0.3]], 1.5)
    archive.expanded(b.id, [1.2, 1.4])  # b's rollouts all fell below its own 2.0
    scores = archive.puct_scores()
    # Q(b) = 1.4, not 2.0: (1.4 - 1.0) / 1.0 = 0.4. Priors and sqrt(1 + T) as above.
    # b: 0.4 + (3/6) * sqrt(2) / 2 = 0.7536; c: 0.5 + (2/6) * sqrt(2) = 0.9714;
    # a: (1/6) * sqrt(2) = 0.2357. So c, not the best state b, is the next start.
    assert scores[b.id] == pytest.approx(0.4 + 0.5 * math.sqrt(2) / 2)
    assert scores[c.id] == pytest.approx(0.5 + (2 / 6) * math.sqrt(2))
    assert scores[a.id] == pytest.approx((1 / 6) * math.sqrt(2))
    assert [s.id for s in archive.choose(1)] == [c.id]


def test_a_visit_counts_for_the_state_and_every_ancestor() -> None:
    archive = Archive(capacity=8, exploration=1.0)
    r = archive.add([[0.1, 0.1]], 1.0)
    archive.expanded(r.id, [1.5])
    x = archive.add([[0.2, 0.2]], 1.5, parent=r)
    archive.expanded(x.id, [2.0])
    y = archive.add([[0.3, 0.3]], 2.0, parent=x)
    archive.expanded(y.id, [1.9])
    z = archive.add([[0.4, 0.4]], 1.2)  # another root, never expanded
    # T = 3. n: r 3 (its own group, x's and y's), x 2 (x's and y's), y 1, z 0.
    assert [s.visits for s in (r, x, y, z)] == [3, 2, 1, 0]
    scores = archive.puct_scores()
    # Rewards y 2.0, x 1.5, z 1.2, r 1.0: span [1.0, 2.0], priors .4, .3, .2, .1,
    # sqrt(1 + 3) = 2. Q: y 1.9 -> 0.9, x 2.0 -> 1.0, z 1.2 -> 0.2, r 1.5 -> 0.5.
    assert scores[y.id] == pytest.approx(0.9 + 0.4 * 2 / 2)  # 1.3
    assert scores[x.id] == pytest.approx(1.0 + 0.3 * 2 / 3)  # 1.2
    assert scores[z.id] == pytest.approx(0.2 + 0.2 * 2 / 1)  # 0.6
    assert scores[r.id] == pytest.approx(0.5 + 0.1 * 2 / 4)  # 0.55


def test_a_visit_reaches_an_ancestor_whose_child_left_the_archive() -> None:
    archive = Archive(capacity=3)
    r = archive.add([[0.1, 0.1]], 1.0)
    x = archive.add([[0.2, 0.2]], 0.9, parent=r)
    y = archive.add([[0.3, 0.3]], 2.0, parent=x)
    archive.add([[0.4, 0.4]], 1.5)  # the fourth state: x, the worst, leaves
    assert x.id not in [s.id for s in archive.states]
    archive.expanded(y.id, [2.1])
    assert (y.visits, r.visits) == (1, 1)


def lineage_archive() -> tuple[Archive, dict[str, int]]:
    """r the root of a (2.0) and b (1.8), a the parent of g (2.2); u (1.1) a root of its own."""
    archive = Archive(capacity=8, exploration=1.0)
    r = archive.add([[0.1, 0.1]], 1.0)
    a = archive.add([[0.2, 0.2]], 2.0, parent=r)
    b = archive.add([[0.3, 0.3]], 1.8, parent=r)
    g = archive.add([[0.4, 0.4]], 2.2, parent=a)
    u = archive.add([[0.5, 0.5]], 1.1)
    return archive, {"r": r.id, "a": a.id, "b": b.id, "g": g.id, "u": u.id}


def test_starts_chosen_together_exclude_each_others_ancestors() -> None:
    archive, ids = lineage_archive()
    names = {state_id: name for name, state_id in ids.items()}
    # T = 0, no visits: Q = R, over the span [1.0, 2.2]; priors 5, 4, 3, 2, 1 over 15.
    # g 1.2/1.2 + 5/15 = 1.333; a 1.0/1.2 + 4/15 = 1.100; b 0.8/1.2 + 3/15 = 0.867;
    # u 0.1/1.2 + 2/15 = 0.217; r 0 + 1/15 = 0.067.
    scores = archive.puct_scores()
    assert scores[ids["a"]] == pytest.approx(1.0 / 1.2 + 4 / 15)
    # g first; a and r are its ancestors; b is a's sibling, not g's ancestor; then u. Asked for
    # five, three come back.
    assert [names[s.id] for s in archive.choose(3)] == ["g", "b", "u"]
    assert [names[s.id] for s in archive.choose(5)] == ["g", "b", "u"]


def test_starts_chosen_together_exclude_each_others_descendants() -> None:
    archive, ids = lineage_archive()
    names = {state_id: name for name, state_id in ids.items()}
    archive.expanded(ids["g"], [1.0])  # g's rollouts scored 1.0: Q(g) = 1.0
    # T = 1, sqrt(2); n: g, a and r 1 (a and r are g's ancestors), b and u 0.
    # g 0.0 + (5/15) sqrt(2) / 2 = 0.236; a 0.833 + (4/15) sqrt(2) / 2 = 1.022;
    # b 0.667 + (3/15) sqrt(2) = 0.950; u 0.083 + (2/15) sqrt(2) = 0.272;
    # r 0 + (1/15) sqrt(2) / 2 = 0.047.
    scores = archive.puct_scores()
    assert scores[ids["a"]] == pytest.approx(1.0 / 1.2 + (4 / 15) * math.sqrt(2) / 2)
    assert scores[ids["g"]] == pytest.approx((5 / 15) * math.sqrt(2) / 2)
    # a first; then b, u; g is a's child and r its parent: both left out.
    assert [names[s.id] for s in archive.choose(5)] == ["a", "b", "u"]


def test_a_child_the_same_as_its_parent_or_a_sibling_is_not_added() -> None:
    archive = Archive(capacity=8)
    root = archive.add([[0.1, 0.1], [0.2, 0.2]], 1.0)
    assert archive.add([[0.1, 0.1], [0.2, 0.2]], 1.0, parent=root) is None  # the parent
    moved = archive.add([[0.5, 0.5], [0.2, 0.2]], 1.3, parent=root)
    assert archive.add([[0.5, 0.5], [0.2, 0.2]], 1.3, parent=root) is None  # a sibling
    assert [s.id for s in archive.states] == [moved.id, root.id]


def test_an_echo_of_the_prompt_is_a_copy_of_its_start() -> None:
    # What the 135M model does: it writes the prompt's centres back.
    start = circles.starting_state(26)
    archive = Archive(capacity=8)
    root = archive.add([list(c) for c in start], circles.reward(start))
    listed = circles.prompt(start).split("):\n", 1)[1].split("\n\n", 1)[0]
    echoed = circles.parse_centres(listed, start)
    assert archive.add([list(c) for c in echoed], circles.reward(echoed), parent=root) is None
    assert len(archive.states) == 1


def test_copies_take_no_place_among_a_parents_children() -> None:
    archive = Archive(capacity=8)  # two children a state by default
    root = archive.add([[0.1, 0.1]], 1.0)
    # Copies (the parent's reward, 1.0) would be the group's best two; they are left out, and
    # the two distinct children, both below the parent, are kept.
    for centres, reward in [([0.1, 0.1], 1.0), ([0.2, 0.2], 0.9), ([0.1, 0.1], 1.0)]:
        archive.add([centres], reward, parent=root)
    archive.add([[0.3, 0.3]], 0.8, parent=root)
    assert [s.reward for s in archive.states] == [1.0, 0.9, 0.8]


def test_a_parent_keeps_its_best_children_up_to_the_cap() -> None:
    archive = Archive(capacity=8)
    assert archive.children_per_state == 2  # the reference's topk_children
    root = archive.add([[0.1, 0.1]], 1.0)
    # In order 1.3 (room), 1.6 (room), 1.2 (below both: out), 1.5 (beats 1.3, which leaves).
    for x, reward in [(0.2, 1.3), (0.3, 1.6), (0.4, 1.2), (0.5, 1.5)]:
        archive.add([[x, x]], reward, parent=root)
    assert [s.reward for s in archive.children(root.id)] == [1.6, 1.5]
    # A tie with the worst kept child keeps the older one.
    assert archive.add([[0.6, 0.6]], 1.5, parent=root) is None
    # Grandchildren count against their own parent only.
    best_child = archive.children(root.id)[0]
    archive.add([[0.7, 0.7]], 1.7, parent=best_child)
    assert [s.reward for s in archive.states] == [1.7, 1.6, 1.5, 1.0]


def test_the_recipe_passes_the_cap_and_adds_rollouts_as_children(tmp_path: Path) -> None:
    from reef.recipes.tttd.recipe import TTTDiscover, TTTDSettings

    recipe = TTTDiscover(TTTDSettings(circles=4, children_per_state=3))
    archive = recipe.archive(tmp_path)
    assert archive.children_per_state == 3
    start = archive.best
    moved = [[0.25, 0.25], *start.centres[1:]]
    group = {"start": start.id, "beta": 1.0, "rewards": [start.reward, circles.reward(moved)]}
    group["centres"] = [start.centres, moved]  # a copy of the start, and one move
    recipe._keep(archive, [start], [group], tmp_path)
    kept = Archive.load(tmp_path / "archive.json")
    assert [s.parent for s in kept.states if s.id != start.id] == [start.id]
    assert len(kept.states) == 2


def test_an_often_expanded_state_gives_way_to_an_unexplored_one() -> None:
    archive = Archive(capacity=8, exploration=2.0)
    best = archive.add([[0.1, 0.1]], 2.0)
    other = archive.add([[0.2, 0.2]], 1.9)
    for _ in range(6):
        archive.expanded(best.id, [1.95])  # its children never beat it
    assert archive.choose(1)[0].id == other.id


def test_the_archive_keeps_its_best_states_and_survives_a_save(tmp_path: Path) -> None:
    archive = Archive(capacity=2)
    first = archive.add([[0.1, 0.5]], 1.0)
    for reward in (3.0, 2.0):
        archive.add([[reward / 10, 0.5]], reward, parent=first)
    assert [s.reward for s in archive.states] == [3.0, 2.0]
    archive.save(tmp_path / "archive.json")
    loaded = Archive.load(tmp_path / "archive.json")
    assert loaded == archive


def test_an_archive_saved_with_parents_only_loads_with_them_as_lineage(tmp_path: Path) -> None:
    state = {"id": 1, "centres": [[0.1, 0.5]], "reward": 1.0, "parent": 0, "visits": 2}
    saved = {"capacity": 16, "exploration": 1.0, "states": [state], "expansions": 2}
    (tmp_path / "archive.json").write_text(json.dumps({**saved, "next_id": 2, "history": []}))
    loaded = Archive.load(tmp_path / "archive.json")
    assert (loaded.states[0].ancestors, loaded.children_per_state) == ([0], 2)


# -- through the whole loop -----------------------------------------------------------------------

CONFIG = """
engine:
  llamacpp: {n_ctx: 1024, n_threads: 2}
gate:
  policy: floor
  floor: 0.0
  # Whatever one step of training did to the best state's answer, on any machine: released.
  groups: {default: {rule: any}}
  max_tokens: 96
learning:
  recipe: tttd
  interval_s: 0.5
  # Eight circles, not the paper's 26, and the fewest rollouts a group may have: the loop is
  # the same, on prompts and answers a third as long (26 circles trained for 40 s a step here).
  circles: 8
  starts: 1
  group_size: 3
  max_tokens: 96
  steps: 1
"""


@pytest.mark.e2e
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
            time.sleep(0.5)
        candidates = httpx.get(f"{server.url}/reef/scenarios/default/candidates").json()["data"]
    archive = Archive.load(tmp_path / ".reef/learning/tttd/archive.json")
    first = archive.history[0]
    start = circles.starting_state(8)
    assert first["groups"][0]["start"] == 0 and len(first["groups"][0]["rewards"]) == 3
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
