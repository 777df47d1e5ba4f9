"""GEPA's search (Agrawal et al., arXiv 2507.19457, Algorithms 1 and 2), free of Reef: a pool
of candidates, each scored on every Pareto task; parents sampled from the Pareto front of
per-task winners; a reflective mutation of one component tried on a minibatch first, and
scored on the Pareto tasks only when it beats its parent there; a budget of metric calls.

Everything that touches a model comes in as a function: `evaluate(tree, tasks)` answers one
`Rollout` per task (one metric call each), `reflect(tree, component, rollouts)` answers the
component's new text (or None: nothing usable). The recipe supplies them (recipe.py).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Tree = dict[str, bytes]


@dataclass(frozen=True)
class Rollout:
    """One task run under one tree: what was asked, answered, scored, and said about it."""

    task: int
    prompt: str
    answer: str
    score: float
    feedback: str = ""


@dataclass
class Candidate:
    tree: Tree
    parent: int | None  # its index in the pool; None for the seed
    component: str | None  # the component its mutation changed
    scores: list[float]  # on each Pareto task, in order

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores) if self.scores else 0.0


@dataclass
class SearchResult:
    pool: list[Candidate]
    metric_calls: int
    # (metric calls spent, best mean on the Pareto tasks so far) after each accepted child.
    curve: list[tuple[int, float]] = field(default_factory=list)
    rejected_on_minibatch: int = 0
    skipped_perfect: int = 0
    unusable_reflections: int = 0

    @property
    def best(self) -> int:
        """The candidate with the best mean on the Pareto tasks (the earliest of a tie)."""
        return max(range(len(self.pool)), key=lambda i: (self.pool[i].mean, -i))


def pareto_front(scores: list[list[float]]) -> dict[int, int]:
    """GEPA's SelectCandidate, before the draw, as the `gepa` package (0.1.4) computes it: for
    each task the candidates that score best on it (its front); then, weakest mean first, a
    candidate is dropped while every front it is on holds another candidate not dropped (it
    adds no task the others do not cover; of candidates tied on every front the strongest
    stays, and of equally strong ones the last met); each one kept with the number of fronts it
    is on, which weighs its draw. (Before, a candidate was dropped only when another was as
    good on every task and better on one, which kept tied and covered candidates the package
    drops; tests/recipes/test_gepa_parity.py holds the two to the same fronts.)"""
    if not scores:
        return {}
    fronts = [
        {k for k in range(len(scores)) if scores[k][t] == max(s[t] for s in scores)}
        for t in range(len(scores[0]))
    ]
    means = [statistics.fmean(row) for row in scores]
    # Ties in the mean in the order the package meets them: by the first task each is best on.
    first = {
        k: next(t for t, front in enumerate(fronts) if k in front) for k in set().union(*fronts)
    }
    weakest_first = sorted(first, key=lambda k: (means[k], first[k], k))
    dropped: set[int] = set()

    def covered(k: int) -> bool:
        return all(front - dropped - {k} for front in fronts if k in front)

    while (
        found := next((k for k in weakest_first if k not in dropped and covered(k)), None)
    ) is not None:
        dropped.add(found)
    kept = set(weakest_first) - dropped
    return {k: sum(k in front for front in fronts) for k in sorted(kept)}


def sample_parent(scores: list[list[float]], rng: random.Random) -> int:
    """A parent drawn from the Pareto front, with odds in proportion to its tasks won."""
    front = pareto_front(scores)
    candidates, weights = list(front), list(front.values())
    if sum(weights) == 0:
        return rng.choice(candidates)
    return rng.choices(candidates, weights=weights, k=1)[0]


def search(
    seed: Tree,
    components: list[str],
    pareto_tasks: list[int],
    feedback_tasks: list[int],
    evaluate: Callable[[Tree, list[int]], list[Rollout]],
    reflect: Callable[[Tree, str, list[Rollout]], Tree | None],
    *,
    max_metric_calls: int,
    minibatch_size: int = 3,
    skip_perfect_score: bool = True,
    perfect_score: float = 1.0,
    rng_seed: int = 0,
    on_progress: Callable[[int, int], Any] | None = None,
) -> SearchResult:
    """GEPA from `seed` until `max_metric_calls` are spent (a step may overrun it by one
    minibatch and one Pareto evaluation, as the paper's loop checks the budget per iteration).
    Components are mutated in turn (round robin), as the paper does for a system of modules."""
    rng = random.Random(rng_seed)
    seed_rollouts = evaluate(seed, pareto_tasks)
    result = SearchResult([Candidate(seed, None, None, [r.score for r in seed_rollouts])], 0)
    result.metric_calls = len(pareto_tasks)
    result.curve.append((result.metric_calls, result.pool[0].mean))
    iteration = 0
    while result.metric_calls < max_metric_calls:
        parent = sample_parent([c.scores for c in result.pool], rng)
        component = components[iteration % len(components)]
        iteration += 1
        batch = rng.sample(feedback_tasks, min(minibatch_size, len(feedback_tasks)))
        before = evaluate(result.pool[parent].tree, batch)
        result.metric_calls += len(batch)
        if skip_perfect_score and all(r.score >= perfect_score for r in before):
            result.skipped_perfect += 1
            _report(on_progress, result, max_metric_calls)
            continue
        child = reflect(result.pool[parent].tree, component, before)
        if child is None or child == result.pool[parent].tree:
            result.unusable_reflections += 1
            _report(on_progress, result, max_metric_calls)
            continue
        after = evaluate(child, batch)
        result.metric_calls += len(batch)
        if sum(r.score for r in after) <= sum(r.score for r in before):
            result.rejected_on_minibatch += 1  # never scored on the Pareto tasks
            _report(on_progress, result, max_metric_calls)
            continue
        scored = evaluate(child, pareto_tasks)
        result.metric_calls += len(pareto_tasks)
        result.pool.append(Candidate(child, parent, component, [r.score for r in scored]))
        result.curve.append((result.metric_calls, result.pool[result.best].mean))
        _report(on_progress, result, max_metric_calls)
    return result


def _report(
    on_progress: Callable[[int, int], Any] | None, result: SearchResult, total: int
) -> None:
    if on_progress is not None:
        on_progress(min(result.metric_calls, total), total)
