"""Scene graphs, the seeded generator and the renderer.

A scene is a handful of objects placed in distinct cells of a 3x3 grid (so
spatial relations are never ambiguous), each with a shape, a colour, a size and
an optional pattern. Objects with the same (shape, colour) are identical — same
size and pattern — which makes "the red circle" a unique reference and "two red
circles" a well-defined count.

Determinism: scene ``i`` of ``generate_scenes(n, seed=s, split=p)`` depends only
on (s, p, i) and :data:`~capscore.scenes.vocab.GENERATOR_VERSION`, never on ``n``,
the platform or the order of calls. Rendering is pure Pillow/numpy drawing with
no anti-aliasing, so pixels are exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from capscore.errors import param_error
from capscore.scenes import captions
from capscore.scenes.lexicon import LANGUAGES, realise
from capscore.scenes.vocab import (
    BACKGROUND, COLOR_NAMES, COLORS, GRID, MAX_OBJECTS, MOTIONS, PATTERNS, REGIONS, SHAPES, SIZES, heldout_pairs,
)

if TYPE_CHECKING:  # pragma: no cover
    from capscore.scenes.captions import Caption, Flaw, OracleScore

SPLITS = ("train", "heldout", "all")
_SPLIT_CODE = {"train": 1, "heldout": 2, "all": 3}
PATTERN_RGB = (15, 15, 15)


@dataclass(frozen=True)
class SceneObject:
    """One object. ``x``, ``y`` are the centre as fractions of the image side (y grows downwards)."""

    shape: str
    color: str
    size: str
    pattern: str | None
    row: int
    col: int
    x: float
    y: float

    @property
    def key(self) -> tuple[str, str]:
        """(shape, colour): identifies the object's group within its scene."""
        return (self.shape, self.color)

    @property
    def region(self) -> str:
        return REGIONS[self.row * GRID + self.col]

    def radius(self, side: int) -> float:
        cell = side / GRID
        return cell * (0.42 if self.size == "large" else 0.27)


@dataclass(frozen=True)
class Group:
    """Identical objects of a scene: their shared attributes and how many there are."""

    shape: str
    color: str
    size: str
    pattern: str | None
    count: int
    members: tuple[int, ...]  # indices into SceneGraph.objects

    @property
    def key(self) -> tuple[str, str]:
        return (self.shape, self.color)


@dataclass(frozen=True)
class SceneGraph:
    """Objects, their groups (counts) and every true pairwise relation between single objects.

    ``relations`` holds (i, relation, j) over object indices for groups of one object,
    in both directions ("left of" and its converse "right of" are both listed).
    """

    objects: tuple[SceneObject, ...]
    groups: tuple[Group, ...]
    relations: tuple[tuple[int, str, int], ...]

    @property
    def counts(self) -> dict[tuple[str, str], int]:
        return {g.key: g.count for g in self.groups}

    def group(self, key: tuple[str, str]) -> Group | None:
        for g in self.groups:
            if g.key == key:
                return g
        return None


def _relations(objects: tuple[SceneObject, ...], groups: tuple[Group, ...]) -> tuple[tuple[int, str, int], ...]:
    singles = [g.members[0] for g in groups if g.count == 1]
    out = []
    for i in singles:
        for j in singles:
            if i == j:
                continue
            a, b = objects[i], objects[j]
            if a.col < b.col:
                out.append((i, "left of", j))
            if a.col > b.col:
                out.append((i, "right of", j))
            if a.row < b.row:
                out.append((i, "above", j))
            if a.row > b.row:
                out.append((i, "below", j))
            if a.row == b.row and abs(a.col - b.col) == 1:
                out.append((i, "next to", j))
    return tuple(out)


def build_graph(objects: tuple[SceneObject, ...]) -> SceneGraph:
    members: dict[tuple[str, str], list[int]] = {}
    for i, o in enumerate(objects):
        members.setdefault(o.key, []).append(i)
    groups = []
    for key, idx in members.items():
        o = objects[idx[0]]
        for j in idx[1:]:
            if (objects[j].size, objects[j].pattern) != (o.size, o.pattern):
                raise ValueError(f"objects {idx[0]} and {j} share {key} but differ in size/pattern")
        groups.append(Group(o.shape, o.color, o.size, o.pattern, len(idx), tuple(idx)))
    return SceneGraph(objects, tuple(groups), _relations(objects, tuple(groups)))


@dataclass(frozen=True)
class Scene:
    """A synthetic scene with its exact ground truth. See ``docs/scenes.md``."""

    id: str
    seed: int
    split: str
    index: int
    size: int
    graph: SceneGraph
    heldout: bool  # contains at least one held-out (shape, colour) pair
    split_seed: int = 0
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def objects(self) -> tuple[SceneObject, ...]:
        return self.graph.objects

    # ------------------------------------------------------------------ pixels
    def render(self, *, size: int | None = None) -> Image.Image:
        """The RGB image (``size`` px square, default the scene's). Deterministic, no anti-aliasing."""
        side = int(size or self.size)
        key = ("render", side)
        if key not in self._cache:
            self._cache[key] = render_objects(self.objects, side)
        return self._cache[key].copy()

    def frames(self, n: int = 8, *, size: int | None = None, distance: float = 0.2) -> "Clip":
        """A short video: ``n`` frames in which every group moves in one direction.

        Each group gets a direction from ``MOTIONS`` (seeded by the scene); objects move
        ``distance`` of the image side in total, linearly, clamped inside the image.
        """
        if not isinstance(n, int) or n < 2:
            raise param_error("n", "Scene.frames", "an int >= 2", n)
        side = int(size or self.size)
        rng = np.random.default_rng([self.seed, _SPLIT_CODE[self.split], self.index, 4242])
        motion = {g.key: MOTIONS[int(rng.integers(len(MOTIONS)))] for g in self.graph.groups}
        step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
        images = []
        for t in range(n):
            f = distance * t / (n - 1)
            moved = []
            for o in self.objects:
                dx, dy = step[motion[o.key]]
                r = o.radius(side) / side
                x = min(max(o.x + dx * f, r), 1 - r)
                y = min(max(o.y + dy * f, r), 1 - r)
                moved.append(SceneObject(o.shape, o.color, o.size, o.pattern, o.row, o.col, x, y))
            images.append(render_objects(tuple(moved), side))
        return Clip(scene=self, frames=tuple(images), motions=tuple(motion.items()))

    # ------------------------------------------------------------------ language (see captions.py)
    def short_caption(self, lang: str = "en") -> str:
        """A COCO-like caption (about 8-15 words) stating only true facts."""
        return captions.short(self).realise(lang)

    def detail_units(self, lang: str = "en") -> list[str]:
        """Ordered detail units; the long caption is ``" ".join(units)``. Each unit adds >= 1 new fact."""
        return [realise(u, lang) for u in captions.detail_units(self)]

    def false_detail_units(self, rng: np.random.Generator, lang: str = "en") -> list[str]:
        """For each detail unit, the same unit made false about this scene: one colour, shape, count,
        region or total changed, or a relation reversed, so that the two differ in exactly one fact (the
        controlled wrong detail of SPECS' SR_neg in ``experiments/replicate.py``, and the specs recipe's
        ``negatives=controlled``). Aligned with :meth:`detail_units`; ``rng`` draws which fact changes."""
        return [realise(u, lang) for u in captions.false_units(self, rng)]

    def long_caption(self, lang: str = "en", *, units: int | None = None) -> str:
        """The first ``units`` detail units (all by default) joined into one caption."""
        parts = self.detail_units(lang)
        sep = "" if lang == "ja" else " "
        return sep.join(parts if units is None else parts[:units])

    def captions(self, lang: str = "en") -> "list[Caption]":
        """Structured captions (text + stated claims): the short one and every long-caption prefix."""
        return captions.caption_set(self, lang)

    def translations(self) -> dict[str, str]:
        """The short caption in every supported language."""
        return {lang: self.short_caption(lang) for lang in LANGUAGES}

    def paraphrases(self, lang: str = "en", *, n: int | None = None) -> list[str]:
        """Alternative phrasings of the short caption's facts (same claims, other words and order)."""
        return captions.paraphrases(self, lang, n=n)

    def flawed(self, kind: str, rng: np.random.Generator, *, lang: str = "en") -> "tuple[str, Flaw]":
        """A caption with one controlled error of ``kind``; ``Flaw.correct`` is its error-free twin.

        Raises :class:`~capscore.errors.CapscoreError` when the scene cannot host that error
        (e.g. ``relation`` in a scene with fewer than two single objects); use
        :func:`capscore.scenes.applicable_errors` to check first.
        """
        flaw = captions.make_flaw(self, kind, rng, lang)
        return flaw.flawed, flaw

    def oracle(self, caption: "Caption") -> "OracleScore":
        """Precision/recall/F1 of a structured caption's claims against this scene's graph."""
        return captions.oracle(self, caption)

    def graded(self, rng: np.random.Generator, *, n: int = 6, lang: str = "en") -> "list[tuple[Caption, OracleScore]]":
        """``n`` captions of graded correctness (coverage and error count vary) with their oracle scores."""
        return captions.graded(self, rng, n=n, lang=lang)


@dataclass(frozen=True)
class Clip:
    """Frames of a scene with moving objects; ``motions`` maps each group key to its direction."""

    scene: Scene
    frames: tuple[Image.Image, ...]
    motions: tuple[tuple[tuple[str, str], str], ...]

    def caption(self, lang: str = "en") -> str:
        return captions.clip_caption(self).realise(lang)


# ---------------------------------------------------------------------------- generation
def _sample_scene(seed: int, split: str, index: int, size: int, split_seed: int,
                  min_objects: int, max_objects: int) -> Scene:
    rng = np.random.default_rng([seed, _SPLIT_CODE[split], index])
    held = heldout_pairs(split_seed)
    n = int(rng.integers(min_objects, max_objects + 1))
    cells = [int(c) for c in rng.permutation(GRID * GRID)[:n]]
    protos: list[tuple[str, str, str, str | None]] = []
    chosen: list[tuple[str, str, str, str | None]] = []
    for k in range(n):
        if protos and rng.random() < 0.3:
            chosen.append(protos[int(rng.integers(len(protos)))])  # another identical object -> counts
            continue
        used = {(p[0], p[1]) for p in protos}
        need_heldout = split == "heldout" and k == 0
        for _ in range(200):
            pair = (SHAPES[int(rng.integers(len(SHAPES)))], COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))])
            if pair in used:
                continue
            if split == "train" and pair in held:
                continue
            if need_heldout and pair not in held:
                continue
            break
        size_ = SIZES[int(rng.integers(len(SIZES)))]
        pattern = None if rng.random() < 0.6 else PATTERNS[int(rng.integers(len(PATTERNS)))]
        proto = (pair[0], pair[1], size_, pattern)
        protos.append(proto)
        chosen.append(proto)
    objects = []
    for (shape, color, size_, pattern), cell in zip(chosen, cells):
        row, col = divmod(cell, GRID)
        radius = (0.42 if size_ == "large" else 0.27) / GRID
        slack = max(0.0, 0.5 / GRID - radius - 1.0 / size)
        x = (col + 0.5) / GRID + float(rng.uniform(-slack, slack))
        y = (row + 0.5) / GRID + float(rng.uniform(-slack, slack))
        objects.append(SceneObject(shape, color, size_, pattern, row, col, x, y))
    objects = tuple(objects)
    is_held = any(o.key in held for o in objects)
    return Scene(f"{split}-{seed}-{index}", seed, split, index, size, build_graph(objects), is_held, split_seed)


def generate_scenes(
    n: int,
    *,
    seed: int = 0,
    split: str = "train",
    size: int = 64,
    start: int = 0,
    min_objects: int = 1,
    max_objects: int = MAX_OBJECTS,
    split_seed: int = 0,
) -> list[Scene]:
    """``n`` scenes (indices ``start .. start+n-1``) of ``split``.

    ``split="train"`` never contains a held-out (shape, colour) pair
    (:func:`~capscore.scenes.vocab.heldout_pairs` of ``split_seed``); ``"heldout"``
    scenes contain at least one; ``"all"`` is unrestricted. Use different ``seed``
    values (or disjoint ``start`` ranges) for training and evaluation sets.
    """
    if not isinstance(n, int) or n < 0:
        raise param_error("n", "generate_scenes", "an int >= 0", n)
    if split not in SPLITS:
        raise param_error("split", "generate_scenes", f"one of {SPLITS}", split)
    if not isinstance(size, int) or not 32 <= size <= 512:
        raise param_error("size", "generate_scenes", "an int in [32, 512]", size)
    if not (isinstance(min_objects, int) and isinstance(max_objects, int)
            and 1 <= min_objects <= max_objects <= MAX_OBJECTS):
        raise param_error("min_objects/max_objects", "generate_scenes",
                          f"ints with 1 <= min_objects <= max_objects <= {MAX_OBJECTS}", (min_objects, max_objects))
    return [_sample_scene(seed, split, start + i, size, split_seed, min_objects, max_objects) for i in range(n)]


# ---------------------------------------------------------------------------- rendering
def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    if shape == "square":
        h = r * 0.85
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.75), (cx - r * 0.95, cy + r * 0.75)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)]
    if shape == "star":
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else r * 0.45
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        return pts
    return None


def _shape_mask(shape: str, cx: float, cy: float, r: float, side: int) -> np.ndarray:
    im = Image.new("L", (side, side), 0)
    d = ImageDraw.Draw(im)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif shape == "cross":
        w = r * 0.34
        d.rectangle([cx - r, cy - w, cx + r, cy + w], fill=255)
        d.rectangle([cx - w, cy - r, cx + w, cy + r], fill=255)
    else:
        d.polygon(_polygon(shape, cx, cy, r), fill=255)
    return np.asarray(im) > 0


def _pattern_mask(pattern: str, cx: float, cy: float, r: float, side: int) -> np.ndarray:
    """Pattern pixels; the centre pixel is never part of the pattern (it shows the true colour)."""
    yy, xx = np.mgrid[0:side, 0:side]
    icx, icy = int(cx), int(cy)
    if pattern == "striped":
        w = max(1, round(r / 3.5))
        band = np.floor((yy - icy + w / 2) / w).astype(int)
        return band % 2 == 1
    # dotted: dots on a lattice offset by half a period from the centre
    p = max(3.0, r * 0.75)
    dx = (xx - icx) % p - p / 2  # zero at icx + p/2: dots sit between the centre and the edge
    dy = (yy - icy) % p - p / 2
    return dx * dx + dy * dy <= (p * 0.28) ** 2


def render_objects(objects: tuple[SceneObject, ...], side: int) -> Image.Image:
    canvas = np.empty((side, side, 3), dtype=np.uint8)
    canvas[:] = BACKGROUND
    for o in objects:
        cx, cy, r = o.x * side, o.y * side, o.radius(side)
        mask = _shape_mask(o.shape, cx, cy, r, side)
        canvas[mask] = COLORS[o.color]
        if o.pattern is not None:
            canvas[mask & _pattern_mask(o.pattern, cx, cy, r, side)] = PATTERN_RGB
    return Image.fromarray(canvas, "RGB")


# ---------------------------------------------------------------------------- counterfactual scenes
COUNTERFACTUAL_KINDS = ("color", "shape", "count", "attribute_swap")


def counterfactual(scene: Scene, flaw: "Flaw") -> "Scene | None":
    """The scene edited so that ``flaw.flawed_caption`` is true of it and ``flaw.correct_caption`` is
    not: the image side of a minimal pair (the same scene with one shape, colour or count changed, or
    two colours swapped), for training with hard negative *images*.

    An image twin makes the flawed caption another image's positive, so a text-only prior (one caption
    reads as more typical than the other) can no longer win the pair; only looking at the scene does.
    Relation flips are not edited (moving an object changes other relations too), nor hallucinations
    (adding the object leaves the correct caption true). Returns None where the edit is impossible (no
    free grid cell for an added object), the oracle does not confirm it, or it would put a held-out
    (shape, colour) pair into a ``train`` scene.
    """
    if flaw.kind not in COUNTERFACTUAL_KINDS:
        return None
    objs = list(scene.objects)
    old = list(flaw.correct_caption.units[0].claims)
    new = list(flaw.flawed_caption.units[0].claims)
    free = [divmod(c, GRID) for c in range(GRID * GRID) if divmod(c, GRID) not in {(o.row, o.col) for o in objs}]

    def place(shape: str, color: str, size: str, pattern: str | None) -> bool:
        if not free:
            return False
        row, col = free.pop(0)
        objs.append(SceneObject(shape, color, size, pattern, row, col, (col + 0.5) / GRID, (row + 0.5) / GRID))
        return True

    if flaw.kind == "attribute_swap":
        colour = {old[0].key: old[1].color, old[1].key: old[0].color}
        objs = [replace(o, color=colour[o.key]) if o.key in colour else o for o in objs]
    else:
        pos = next(k for k, (m, n) in enumerate(zip(old, new)) if m != n)
        m, n = old[pos], new[pos]
        if flaw.kind in ("color", "shape"):
            objs = [replace(o, shape=n.shape, color=n.color) if o.key == m.key else o for o in objs]
        elif n.count < m.count:  # count down: drop the group's last members
            drop = [i for i, o in enumerate(objs) if o.key == m.key][n.count:]
            objs = [o for i, o in enumerate(objs) if i not in drop]
        else:  # count up: more identical members in free cells
            proto = next(o for o in objs if o.key == m.key)
            for _ in range(n.count - m.count):
                if not place(proto.shape, proto.color, proto.size, proto.pattern):
                    return None
    try:
        graph = build_graph(tuple(objs))
    except ValueError:
        return None
    held = heldout_pairs(scene.split_seed)
    is_held = any(o.key in held for o in objs)
    if scene.split == "train" and is_held:
        return None
    twin = Scene(f"{scene.id}~{flaw.kind}", scene.seed, scene.split, scene.index, scene.size, graph, is_held,
                 scene.split_seed)
    if (captions.oracle(twin, flaw.flawed_caption).precision < 1
            or captions.oracle(twin, flaw.correct_caption).precision == 1):
        return None
    return twin
