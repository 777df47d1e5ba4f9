"""GEPA's candidate selection held to the GEPA authors' own package (`gepa` 0.1.4, the oracle):
on random score matrices, the same Pareto front and the same weights as its
`remove_dominated_programs`, so the parents drawn follow the same odds (the draws themselves
differ: the package picks from a list with each candidate repeated, ours by weights).

Before this test, ours kept candidates tied on every front and ones whose tasks others covered,
which the package drops: 609 of 2,000 random matrices had another front."""

from __future__ import annotations

import random
import statistics
from collections import Counter

from gepa.gepa_utils import remove_dominated_programs

from reef.recipes.gepa.search import pareto_front, sample_parent


def upstream_front(scores: list[list[float]]) -> dict[int, int]:
    """The package's front: per task the best candidates, pruned by its dominance, each with
    the number of fronts it stays on (the weight of its draw)."""
    fronts = {
        task: {k for k, row in enumerate(scores) if row[task] == max(r[task] for r in scores)}
        for task in range(len(scores[0]))
    }
    means = {k: statistics.fmean(row) for k, row in enumerate(scores)}
    kept = remove_dominated_programs(fronts, scores=means)
    return dict(sorted(Counter(k for front in kept.values() for k in front).items()))


def random_scores(rng: random.Random) -> list[list[float]]:
    candidates, tasks = rng.randint(1, 6), rng.randint(1, 6)
    return [
        [
            float(rng.random() < 0.5) if rng.random() < 0.7 else round(rng.random(), 1)
            for _ in range(tasks)
        ]
        for _ in range(candidates)
    ]


def test_the_front_and_its_weights_are_the_package_s() -> None:
    rng = random.Random(0)
    for _ in range(5000):
        scores = random_scores(rng)
        assert pareto_front(scores) == upstream_front(scores), scores


def test_a_tie_on_every_front_keeps_one_and_a_covered_candidate_goes() -> None:
    # 0 and 1 tie everywhere: the package keeps one. 2 is best only where 3 is best too, and
    # weaker on the mean: its tasks are covered, it goes.
    tied = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    assert pareto_front(tied) == upstream_front(tied) == {1: 1, 2: 1}
    covered = [[1.0, 0.0, 0.2], [0.0, 1.0, 0.2], [0.0, 1.0, 0.9]]
    assert pareto_front(covered) == upstream_front(covered) == {0: 1, 2: 2}


def test_parents_are_drawn_with_odds_in_proportion_to_their_fronts() -> None:
    scores = [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    rng = random.Random(1)
    drawn = Counter(sample_parent(scores, rng) for _ in range(4000))
    assert abs(drawn[0] / 4000 - 0.75) < 0.03  # 3 fronts of 4
