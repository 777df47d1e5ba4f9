"""How sure a count is: Wilson's interval of a rate, Newcombe's of a change between two rates.

A verdict on 2 of 6 is a wide guess, and these say how wide. `wilson` is the score interval of a
proportion (Wilson 1927); `change_interval` the hybrid score interval of a difference of two
proportions, method 10 of Newcombe, "Interval estimation for the difference between independent
proportions", Statistics in Medicine 1998. Counts may be fractional: a score between 0 and 1
with mean p varies no more than a pass/fail with rate p, so treating the sum of such scores as a
count of passes gives an interval at least as wide as it should be.

The gate compares answers that are paired (both sides answer the same tasks on the same seeds)
and clustered (several samples of one task); Newcombe's interval treats them as independent, so
it is wider than a paired one on the first count and narrower than a clustered one on the
second (docs/releases.md says how the gate uses them).
"""

from __future__ import annotations

import math

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval
Z95_ONE_SIDED = 1.644854  # the normal quantile of a one-sided 95% bound


def wilson(passed: float, count: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `passed` of `count` (0..1 for no count)."""
    if count == 0:
        return 0.0, 1.0
    rate = passed / count
    centre = rate + z * z / (2 * count)
    spread = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count))
    scale = 1 + z * z / count
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def change_interval(
    before: float, after: float, count: float, z: float = Z95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval of after/count - before/count."""
    if count == 0:
        return -1.0, 1.0
    p1, p2 = after / count, before / count
    l1, u1 = wilson(after, count, z)
    l2, u2 = wilson(before, count, z)
    difference = p1 - p2
    low = difference - math.hypot(p1 - l1, u2 - p2)
    high = difference + math.hypot(u1 - p1, p2 - l2)
    return max(-1.0, low), min(1.0, high)


def worse_beyond_noise(bar: float, candidate: float, count: float, margin: float = 0.0) -> bool:
    """Whether `candidate` of `count` is below `bar` of `count` by more than `margin`, beyond
    the noise: the one-sided 95% upper bound of the change is below -margin."""
    _, high = change_interval(bar, candidate, count, Z95_ONE_SIDED)
    return high < -margin


def gain_beyond_noise(before: float, after: float, count: float, margin: float = 0.0) -> bool:
    """Whether `after` of `count` is above `before` of `count` by more than `margin`, beyond
    the noise: the lower end of the two-sided 95% interval of the change is above `margin`."""
    low, _ = change_interval(before, after, count)
    return low > margin
