"""Captions from scene graphs: short, long (detail units), paraphrases, controlled errors, the oracle.

Every caption is a :class:`Caption` — a tuple of :class:`~capscore.scenes.claims.Unit`
— realised into text per language by :mod:`capscore.scenes.lexicon`. Because the
text is generated from the claims, the facts a caption states are known exactly,
and the oracle's precision/recall/F1 is exact, in every language.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from capscore.errors import CapscoreError, unknown_name
from capscore.scenes.claims import CONVERSE, Mention, Motion, Relation, Total, Unit, Where, relation_fact
from capscore.scenes.lexicon import SEPARATOR, realise
from capscore.scenes.vocab import COLOR_NAMES, PATTERNS, REGIONS, SHAPES, SIZES, heldout_pairs

if TYPE_CHECKING:  # pragma: no cover
    from capscore.scenes.graph import Clip, Group, Scene

ERROR_KINDS: tuple[str, ...] = (
    "color", "shape", "size", "pattern", "attribute", "count", "attribute_swap", "relation", "hallucination", "object",
)
LONG_TOKEN_BUDGET = 190  # long captions stop before exceeding ~this many CLIP BPE tokens (English estimate)


@dataclass(frozen=True)
class Caption:
    """A caption as claims (``units``) plus the language and template style it is written in."""

    units: tuple[Unit, ...]
    lang: str = "en"
    style: int = 0

    @property
    def text(self) -> str:
        return self.realise()

    def realise(self, lang: str | None = None, style: int | None = None) -> str:
        lang = lang or self.lang
        st = self.style if style is None else style
        return SEPARATOR[lang].join(realise(u, lang, st) for u in self.units)

    def facts(self) -> set[tuple]:
        out: set[tuple] = set()
        for u in self.units:
            out |= u.facts()
        return out

    def in_lang(self, lang: str) -> "Caption":
        return Caption(self.units, lang, self.style)


@dataclass(frozen=True)
class OracleScore:
    """Exact quality of a caption: precision, recall and F1 of its stated facts against the graph."""

    precision: float
    recall: float
    f1: float
    stated: int
    correct: int
    true: int


@dataclass(frozen=True)
class Flaw:
    """One controlled error: ``flawed_caption`` differs from ``correct_caption`` only by ``kind``."""

    kind: str
    detail: str
    correct_caption: Caption
    flawed_caption: Caption

    @property
    def correct(self) -> str:
        return self.correct_caption.text

    @property
    def flawed(self) -> str:
        return self.flawed_caption.text


# ---------------------------------------------------------------------------- ground truth
def _mention(g: "Group", *, detail: bool = True) -> Mention:
    return Mention(g.shape, g.color, g.count, g.size if detail else None, g.pattern if detail else None)


def truth(scene: "Scene") -> set[tuple]:
    """Every atomic fact true of the scene (see :mod:`capscore.scenes.claims`)."""
    graph = scene.graph
    out: set[tuple] = {("total", len(graph.objects))}
    for g in graph.groups:
        out |= _mention(g).facts()
        if g.count == 1:
            out.add(("where", g.shape, g.color, graph.objects[g.members[0]].region))
    for i, rel, j in graph.relations:
        out.add(relation_fact(graph.objects[i].key, rel, graph.objects[j].key))
    return out


def oracle(scene: "Scene", caption: Caption, *, clip: "Clip | None" = None) -> OracleScore:
    """Precision = correct/stated, recall = correct/true, F1 their harmonic mean (0 when both are 0).

    With ``clip``, the motion facts of that clip are part of the truth.
    """
    true = truth(scene)
    if clip is not None:
        true |= {("motion", s, c, d) for (s, c), d in clip.motions}
    stated = caption.facts()
    correct = len(stated & true)
    p = correct / len(stated) if stated else 0.0
    r = correct / len(true) if true else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return OracleScore(p, r, f1, len(stated), correct, len(true))


# ---------------------------------------------------------------------------- correct captions
def _singles(scene: "Scene") -> list["Group"]:
    return [g for g in scene.graph.groups if g.count == 1]


def _directional(scene: "Scene") -> list[tuple[int, str, int]]:
    return [r for r in scene.graph.relations if r[1] != "next to"]


def short(scene: "Scene", lang: str = "en") -> Caption:
    """COCO-like: one relation between the first two single objects if there are two, else up to three groups."""
    graph = scene.graph
    singles = _singles(scene)
    if len(singles) >= 2:
        a, b = singles[0].members[0], singles[1].members[0]
        rel = next(r for (i, r, j) in graph.relations if i == a and j == b and r != "next to")
        ga, gb = singles[0], singles[1]
        return Caption((Unit("relphrase", (Relation(_mention(ga), rel, _mention(gb)),)),), lang)
    return Caption((Unit("picture", tuple(_mention(g) for g in graph.groups[:3])),), lang)


def _estimate_tokens(text: str) -> int:
    """CLIP BPE tokens of an English sentence: one per word plus one per punctuation mark."""
    return len(text.split()) + sum(text.count(p) for p in ".,")


def detail_units(scene: "Scene") -> list[Unit]:
    """Ordered units: total, then per group "exists" (+ "where" for single objects), then relations.

    Each unit states at least one fact no earlier unit stated. Relations are listed
    per pair of single objects (horizontal, vertical, "next to"); the list stops
    before the English caption would exceed :data:`LONG_TOKEN_BUDGET` tokens.
    """
    graph = scene.graph
    units = [Unit("total", (Total(len(graph.objects)),))]
    for g in graph.groups:
        units.append(Unit("exists", (_mention(g),)))
        if g.count == 1:
            units.append(Unit("where", (Where(_mention(g, detail=False), graph.objects[g.members[0]].region),)))
    for i, rel, j in graph.relations:
        if i < j:
            a, b = graph.objects[i], graph.objects[j]
            units.append(Unit("relation", (Relation(Mention(*a.key), rel, Mention(*b.key)),)))
    out, seen, tokens = [], set(), 2  # start and end tokens
    for u in units:
        new = u.facts() - seen
        if not new:
            continue
        t = _estimate_tokens(realise(u, "en"))
        if tokens + t > LONG_TOKEN_BUDGET:
            break
        out.append(u)
        seen |= new
        tokens += t
    return out


def caption_set(scene: "Scene", lang: str = "en") -> list[Caption]:
    """The short caption, then every prefix c_1 ⊂ c_2 ⊂ ... of the long caption."""
    units = detail_units(scene)
    return [short(scene, lang)] + [Caption(tuple(units[:k]), lang) for k in range(1, len(units) + 1)]


def paraphrases(scene: "Scene", lang: str = "en", *, n: int | None = None) -> list[str]:
    """Other phrasings of the short caption's claims: other templates, mention orders, converse relations."""
    base = short(scene, lang)
    unit = base.units[0]
    variants: list[Unit] = [unit]
    if unit.form == "relphrase":
        variants.append(Unit("relphrase", (unit.claims[0].converse(),)))
    else:
        ms = unit.claims
        variants += [Unit("picture", ms[k:] + ms[:k]) for k in range(1, len(ms))]
        variants.append(Unit("picture", tuple(reversed(ms))))
    canonical = base.text
    out: list[str] = []
    for style in range(3):
        for v in variants:
            t = Caption((v,), lang, style).text
            if t != canonical and t not in out:
                out.append(t)
    return out if n is None else out[:n]


def clip_caption(clip: "Clip") -> Caption:
    motions = dict(clip.motions)
    return Caption((Unit("motion", tuple(Motion(Mention(g.shape, g.color, g.count), motions[g.key])
                                         for g in clip.scene.graph.groups)),))


# ---------------------------------------------------------------------------- controlled errors
def _avoid(scene: "Scene") -> frozenset:
    """Training scenes never *mention* held-out pairs either, not even in negatives."""
    return heldout_pairs(scene.split_seed) if scene.split == "train" else frozenset()


def _pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(len(items)))]


def _free_pairs(scene: "Scene", *, shape: str | None = None, color: str | None = None,
                not_shape: str | None = None, not_color: str | None = None) -> list[tuple[str, str]]:
    used = set(scene.graph.counts) | _avoid(scene)
    return [(s, c) for s in SHAPES for c in COLOR_NAMES
            if (s, c) not in used and (shape is None or s == shape) and (color is None or c == color)
            and s != not_shape and c != not_color]


def applicable_errors(scene: "Scene") -> list[str]:
    """The error kinds :func:`make_flaw` can produce for this scene."""
    out = []
    groups = scene.graph.groups
    for kind in ERROR_KINDS:
        if kind == "attribute_swap" and not _swappable(scene):
            continue
        if kind == "relation" and not _directional(scene):
            continue
        if kind == "color" and not any(_free_pairs(scene, shape=g.shape) for g in groups):
            continue
        if kind == "shape" and not any(_free_pairs(scene, color=g.color) for g in groups):
            continue
        out.append(kind)
    return out


def _swappable(scene: "Scene") -> list[tuple["Group", "Group"]]:
    groups = scene.graph.groups
    used = set(scene.graph.counts) | _avoid(scene)
    return [(g, h) for i, g in enumerate(groups) for h in groups[i + 1:]
            if g.shape != h.shape and g.color != h.color
            and (g.shape, h.color) not in used and (h.shape, g.color) not in used]


def _with_context(scene: "Scene", g: "Group", rng: np.random.Generator) -> list[Mention]:
    others = [h for h in scene.graph.groups if h.key != g.key]
    ms = [_mention(g)]
    if others and rng.random() < 0.5:
        ms.insert(int(rng.integers(2)), _mention(_pick(rng, others)))
    return ms


def _bound_only(items: list, keep) -> list:
    """The items ``keep`` accepts, or all of them where it accepts none."""
    kept = [x for x in items if keep(x)]
    return kept or items


def make_flaw(scene: "Scene", kind: str, rng: np.random.Generator, lang: str = "en", *, bound: bool = False) -> Flaw:
    """One caption with a controlled error of ``kind`` and its correct twin (see :data:`ERROR_KINDS`).

    ``bound=True`` draws colour, shape, count and hallucination errors only among *bound* ones where the
    scene allows any: the value the error introduces is already in the scene on another object (a red
    circle called a star next to a green star; a group of two called three next to a group of three; a
    hallucinated object whose shape and colour both occur), so every word of the false caption describes
    something in the image and only binding tells the captions apart
    (:func:`capscore.scenes.evaluate.needs_binding` is the same rule). Where the scene has no bound
    option for the kind, the usual draw. The default (False) draws values uniformly among the allowed
    ones, as every evaluation does; with it, the random draws are the same as before the option existed.
    """
    if kind not in ERROR_KINDS:
        raise unknown_name("error kind", kind, ERROR_KINDS)
    if kind not in applicable_errors(scene):
        raise CapscoreError(f"scene {scene.id}: cannot make a {kind!r} error here "
                            f"(applicable: {', '.join(applicable_errors(scene))})")
    if kind == "attribute":
        kind = _pick(rng, ["size", "pattern"])
    groups = list(scene.graph.groups)

    def picture(ms: list[Mention]) -> Caption:
        return Caption((Unit("picture", tuple(ms)),), lang)

    if kind == "attribute_swap":
        g, h = _pick(rng, _swappable(scene))
        a, b = Mention(g.shape, g.color, g.count), Mention(h.shape, h.color, h.count)
        fa, fb = Mention(g.shape, h.color, g.count), Mention(h.shape, g.color, h.count)
        return Flaw(kind, f"{g.color} {g.shape} + {h.color} {h.shape} -> {h.color} {g.shape} + {g.color} {h.shape}",
                    picture([a, b]), picture([fa, fb]))
    if kind == "relation":
        i, rel, j = _pick(rng, _directional(scene))
        oa, ob = scene.objects[i], scene.objects[j]
        r = Relation(Mention(*oa.key), rel, Mention(*ob.key))
        bad = Relation(r.a, CONVERSE[rel], r.b)
        return Flaw(kind, f"{oa.color} {oa.shape} {rel} -> {CONVERSE[rel]} {ob.color} {ob.shape}",
                    Caption((Unit("relphrase", (r,)),), lang), Caption((Unit("relphrase", (bad,)),), lang))
    shapes = {o.shape for o in scene.graph.objects}
    colours = {o.color for o in scene.graph.objects}
    counts = scene.graph.counts

    def other_count(g, k: int) -> bool:  # another group has k objects
        return any(n == k for key, n in counts.items() if key != g.key)

    def count_options(g) -> list[int]:
        options = [k for k in (g.count - 1, g.count + 1, g.count + 2) if 1 <= k <= 6]
        return _bound_only(options, lambda k: other_count(g, k)) if bound else options

    def new_colours(g) -> list[tuple[str, str]]:
        pairs = _free_pairs(scene, shape=g.shape)
        return _bound_only(pairs, lambda sc: sc[1] in colours) if bound else pairs

    def new_shapes(g) -> list[tuple[str, str]]:
        pairs = _free_pairs(scene, color=g.color)
        return _bound_only(pairs, lambda sc: sc[0] in shapes) if bound else pairs

    if kind == "hallucination":
        g = _pick(rng, groups)
        ms = _with_context(scene, g, rng)
        extras = _free_pairs(scene)
        if bound:
            extras = _bound_only(extras, lambda sc: sc[0] in shapes and sc[1] in colours)
        s, c = _pick(rng, extras)
        extra = Mention(s, c, 1, _pick(rng, list(SIZES)))
        bad = list(ms)
        bad.insert(int(rng.integers(len(bad) + 1)), extra)
        return Flaw(kind, f"+ {extra.size} {c} {s}", picture(ms), picture(bad))
    # single-mention edits: color, shape, size, pattern, count, object
    if kind == "color":
        pool = [g for g in groups if _free_pairs(scene, shape=g.shape)]
        g = _pick(rng, _bound_only(pool, lambda g: new_colours(g)[0][1] in colours) if bound else pool)
    elif kind == "shape":
        pool = [g for g in groups if _free_pairs(scene, color=g.color)]
        g = _pick(rng, _bound_only(pool, lambda g: new_shapes(g)[0][0] in shapes) if bound else pool)
    elif kind == "count" and bound:
        g = _pick(rng, _bound_only(groups, lambda g: other_count(g, count_options(g)[0])))
    else:
        g = _pick(rng, groups)
    ms = _with_context(scene, g, rng)
    pos = next(k for k, m in enumerate(ms) if m.key == g.key)
    m = ms[pos]
    if kind == "color":
        _, c = _pick(rng, new_colours(g))
        new, what = Mention(m.shape, c, m.count, m.size, m.pattern), f"{m.color} -> {c}"
    elif kind == "shape":
        s, _ = _pick(rng, new_shapes(g))
        new, what = Mention(s, m.color, m.count, m.size, m.pattern), f"{m.shape} -> {s}"
    elif kind == "size":
        other = SIZES[1 - SIZES.index(m.size)]
        new, what = Mention(m.shape, m.color, m.count, other, m.pattern), f"{m.size} -> {other}"
    elif kind == "pattern":
        choices = [p for p in PATTERNS if p != m.pattern]
        p = _pick(rng, choices)
        new, what = Mention(m.shape, m.color, m.count, m.size, p), f"{m.pattern or 'plain'} -> {p}"
    elif kind == "count":
        k = _pick(rng, count_options(g))
        new, what = Mention(m.shape, m.color, k, m.size, m.pattern), f"{m.count} -> {k}"
    else:  # object
        s, c = _pick(rng, _free_pairs(scene, not_shape=g.shape, not_color=g.color))
        new, what = Mention(s, c, m.count, m.size, m.pattern), f"{m.color} {m.shape} -> {c} {s}"
    bad = list(ms)
    bad[pos] = new
    return Flaw(kind, f"{g.color} {g.shape}: {what}", picture(ms), picture(bad))


# ---------------------------------------------------------------------------- graded captions
def _corrupt(scene: "Scene", u: Unit, rng: np.random.Generator) -> Unit:
    """One false statement in place of unit ``u`` (same form)."""
    c = u.claims[0]
    if u.form == "total":
        n = c.n + (1 if c.n == 1 or rng.random() < 0.5 else -1)
        return Unit("total", (Total(n),))
    if u.form == "where":
        return Unit("where", (Where(c.m, _pick(rng, [r for r in REGIONS if r != c.region])),))
    if u.form == "relation":
        if c.rel != "next to":
            return Unit("relation", (Relation(c.a, CONVERSE[c.rel], c.b),))
        # "next to" is symmetric (its converse states the same fact): claim a direction that does not hold
        known = truth(scene)
        false = [r for r in ("left of", "right of", "above", "below")
                 if relation_fact(c.a.key, r, c.b.key) not in known]
        if false:
            return Unit("relation", (Relation(c.a, _pick(rng, false), c.b),))
        return Unit("relation", (Relation(Mention(c.a.shape, c.a.color, c.a.count + 1), c.rel, c.b),))
    m: Mention = c
    options = [("count", None)]
    if _free_pairs(scene, shape=m.shape):
        options.append(("color", None))
    if _free_pairs(scene, color=m.color):
        options.append(("shape", None))
    what, _ = _pick(rng, options)
    if what == "color":
        _, col = _pick(rng, _free_pairs(scene, shape=m.shape))
        m = Mention(m.shape, col, m.count, m.size, m.pattern)
    elif what == "shape":
        s, _ = _pick(rng, _free_pairs(scene, color=m.color))
        m = Mention(s, m.color, m.count, m.size, m.pattern)
    else:
        m = Mention(m.shape, m.color, m.count + 1, m.size, m.pattern)
    return Unit("exists", (m,))


def false_units(scene: "Scene", rng: np.random.Generator) -> list[Unit]:
    """Each of the scene's detail units made false (one fact changed, the same form; see :meth:`Scene.
    false_detail_units`), aligned with :func:`detail_units`."""
    return [_corrupt(scene, u, rng) for u in detail_units(scene)]


def graded(scene: "Scene", rng: np.random.Generator, *, n: int = 6, lang: str = "en") -> list[tuple[Caption, OracleScore]]:
    """``n`` captions of graded quality: a prefix of the long caption (random length) with 0-3 units
    made false, sometimes plus one hallucinated object; each with its oracle score."""
    units = detail_units(scene)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, len(units) + 1))
        chosen = list(units[:k])
        n_err = int(rng.integers(0, min(3, k) + 1))
        for idx in rng.choice(k, size=n_err, replace=False):
            chosen[int(idx)] = _corrupt(scene, chosen[int(idx)], rng)
        if rng.random() < 0.25 and _free_pairs(scene):
            s, c = _pick(rng, _free_pairs(scene))
            chosen.insert(int(rng.integers(len(chosen) + 1)), Unit("exists", (Mention(s, c, 1, _pick(rng, list(SIZES))),)))
        cap = Caption(tuple(chosen), lang)
        out.append((cap, oracle(scene, cap)))
    return out
