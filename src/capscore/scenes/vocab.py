"""The closed vocabulary of synthetic scenes and the systematic-generalization split.

Everything a scene can contain is listed here once; renderers, lexicons,
captions and the oracle all read these tuples. Changing them changes every
scene, so they are part of the generator's version (``GENERATOR_VERSION``).
"""
from __future__ import annotations

import numpy as np

GENERATOR_VERSION = "scenes-v1"

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star", "cross")

# Saturated, well separated colours; the background is a neutral grey none of them is close to.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 235),
    "yellow": (245, 225, 20),
    "purple": (140, 40, 200),
    "orange": (250, 135, 20),
    "pink": (250, 120, 200),
    "white": (250, 250, 250),
}
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)
BACKGROUND: tuple[int, int, int] = (110, 110, 110)

SIZES: tuple[str, ...] = ("small", "large")
PATTERNS: tuple[str, ...] = ("striped", "dotted")  # an object may also be plain (pattern None)

# Spatial relations stated between two single objects. "left of"/"above" hold when the two
# objects sit in different grid columns/rows; "next to" when they are in neighbouring
# columns of the same row. "right of"/"below" are the converses.
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below", "next to")
MOTIONS: tuple[str, ...] = ("left", "right", "up", "down")

GRID = 3  # objects occupy distinct cells of a GRID x GRID layout, so relations are never ambiguous
REGIONS: tuple[str, ...] = (
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)
MAX_OBJECTS = 6


def heldout_pairs(seed: int = 0) -> frozenset[tuple[str, str]]:
    """The (shape, color) combinations that never appear in ``split="train"`` scenes.

    One shape per colour (8 of the 48 pairs), every shape held out at least once,
    chosen by ``seed``: held-out scenes test composition of *seen* attributes.
    """
    rng = np.random.default_rng([seed, 7919])
    shapes = [SHAPES[i] for i in rng.permutation(len(SHAPES))]
    colors = [COLOR_NAMES[i] for i in rng.permutation(len(COLOR_NAMES))]
    return frozenset((shapes[i % len(shapes)], c) for i, c in enumerate(colors))
