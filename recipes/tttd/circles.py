"""The circle-packing task: n circles in the unit square, scored by the sum of their radii.

A **state** is a list of n centres. The model is asked for centres, one `x y` per line; the
answer's numbers in [0, 1], read in pairs, replace the state's centres in order (circles the
answer does not reach keep their place). The radii then follow from the centres: each circle,
in order, grows as far as the square's sides and the circles before it allow (an earlier circle
that holds a later centre shrinks to reach it). The result is always a packing, so every answer
has a reward, and a better layout of centres has a higher one.

The **verifier** trusts none of that: it checks a packing as given, with a tolerance of 1e-9,
rejecting a circle outside the square, an overlap, or a negative radius, and scores the sum of
the radii. The best known packing of 26 circles sums to 2.635983 (Packomania, as cited by
AlphaEvolve and TTT-Discover).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 1e-9
BEST_KNOWN = {26: 2.635983, 32: 2.939}  # published best sums of radii
NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)"
NUMBER_TOKEN = re.compile(rf"(?<![\w.]){NUMBER}")
CENTRE_LINE = re.compile(rf"({NUMBER})[\s,;]+({NUMBER})")
PROMPT = """Pack {n} circles into the unit square [0, 1] x [0, 1] so that the sum of their radii \
is as large as possible. Circles may not overlap or leave the square. Each circle's radius is \
made as large as the square and the circles listed before it allow.

Current centres (sum of radii {score:.4f}):
{centres}

Write {n} improved centres, one "x y" per line, nothing else."""


class InvalidPacking(ValueError):
    """A packing the verifier rejects, saying which circle and why."""


@dataclass(frozen=True)
class Circle:
    x: float
    y: float
    r: float


Centres = list[tuple[float, float]]


def verify(circles: list[Circle], tolerance: float = TOLERANCE) -> float:
    """The sum of the radii of a valid packing; InvalidPacking for any violation."""
    for index, c in enumerate(circles):
        if not all(math.isfinite(v) for v in (c.x, c.y, c.r)) or c.r < 0:
            raise InvalidPacking(f"circle {index} has radius {c.r} or a centre that is not finite")
        if min(c.x - c.r, c.y - c.r) < -tolerance or max(c.x + c.r, c.y + c.r) > 1 + tolerance:
            raise InvalidPacking(f"circle {index} at ({c.x}, {c.y}) r {c.r} leaves the square")
    for i, a in enumerate(circles):
        for j in range(i + 1, len(circles)):
            b = circles[j]
            gap = math.hypot(a.x - b.x, a.y - b.y) - (a.r + b.r)
            if gap < -tolerance:
                raise InvalidPacking(f"circles {i} and {j} overlap by {-gap:.3g}")
    return sum(c.r for c in circles)


def grown(centres: Centres) -> list[Circle]:
    """Circles on `centres`, each grown in order as far as the sides and earlier circles allow.

    A centre that falls inside an earlier circle shrinks that circle to reach it (a circle of
    radius 0 there); shrinking never breaks a packing, so the result is always valid.
    """
    placed: list[tuple[float, float]] = []
    radii: list[float] = []
    for x, y in centres:
        x, y = min(max(x, 0.0), 1.0), min(max(y, 0.0), 1.0)
        room = min(x, y, 1.0 - x, 1.0 - y)
        for index, (px, py) in enumerate(placed):
            distance = math.hypot(x - px, y - py)
            radii[index] = min(radii[index], distance)
            room = min(room, distance - radii[index])
        placed.append((x, y))
        radii.append(max(0.0, room - 1e-12))  # just inside: rounding stays valid
    return [Circle(x, y, r) for (x, y), r in zip(placed, radii, strict=True)]


def reward(centres: Centres) -> float:
    """The verified sum of radii of the packing grown on `centres`."""
    return verify(grown(centres))


def parse_centres(answer: str, state: Centres) -> Centres:
    """The answer's numbers in [0, 1], read in pairs as centres, replacing the state's in order;
    the rest stay. Lenient on purpose: a small model's list is rarely clean, and any numbers it
    writes are a move the verifier can score."""
    numbers = [float(n) for n in NUMBER_TOKEN.findall(answer)]
    inside = [n for n in numbers if 0.0 <= n <= 1.0]
    found = list(zip(inside[0::2], inside[1::2], strict=False))
    return found[: len(state)] + state[len(found) :]


def prompt(state: Centres) -> str:
    return PROMPT.format(
        n=len(state),
        score=reward(state),
        centres="\n".join(f"{x:.2f} {y:.2f}" for x, y in state),
    )


def starting_state(n: int, seed: int = 0) -> Centres:
    """A seeded random layout: where discovery starts."""
    rng = random.Random(seed)
    return [(round(rng.random(), 2), round(rng.random(), 2)) for _ in range(n)]


def score_answer(answer: str, task: Any) -> float:
    """A gate scorer (`python` type): the answer's packing, from the state in the task's prompt,
    as a share of the best known sum of radii for n circles (an area bound for other n)."""
    state = state_in_prompt(task.messages[-1]["content"])
    # Unknown n: n circles of radius r fill at most the square's area, so Σr ≤ sqrt(n / π).
    best = BEST_KNOWN.get(len(state)) or math.sqrt(len(state) / math.pi)
    return min(1.0, reward(parse_centres(answer, state)) / best)


def state_in_prompt(text: str) -> Centres:
    listed = text.split("Current centres", 1)[1].split("\n\n", 1)[0]
    return [(float(x), float(y)) for x, y in CENTRE_LINE.findall(listed.split(":", 1)[1])]


def draw(circles: list[Circle], path: Path, title: str) -> None:
    """The packing as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 5))
    axes.add_patch(plt.Rectangle((0, 0), 1, 1, fill=False, linewidth=1.5))
    for c in circles:
        axes.add_patch(plt.Circle((c.x, c.y), c.r, fill=True, alpha=0.5, edgecolor="black"))
    axes.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), aspect="equal", title=title)
    axes.set_xticks([])
    axes.set_yticks([])
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
