"""LGIP caption variants (Lee, 2025, "Language-Guided Invariance Probing of
Vision-Language Models", section 3.2; reference code ``make_perturb_with_fliptypes.py``).

Paraphrases (meaning kept): the caption inside fixed templates and prefixes
(:data:`TEMPLATES`). Empty/short (< ``min_chars``, 5) and duplicate results and
the original itself are dropped; at most ``k_same`` (6) are kept, sampled with a
seeded generator when there are more (the reference samples with
``random.sample``; we keep the sampled ones in template order so output is
stable to read).

Semantic flips (meaning changed): for each word list (color, count, object,
plus user lists) the *first* whole-word match of any list word
(``\\b(w1|w2|...)\\b``, case-sensitive as in the reference; ``ignore_case``
option) is replaced by another word of the same list, chosen by the seeded
generator (``per_type=1`` as in the reference; ``per_type=None`` makes one flip
per alternative word). Duplicates and flips equal to the original are dropped,
at most ``k_diff`` (6) are kept. Each flip records its type and the words
swapped. Word boundaries mean "redwood" is not a color and "cathedral" not a cat.

Determinism: one generator per caption, ``random.Random(f"{seed}|lgip|{caption}")``.
"""
from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TEMPLATES: tuple[str, ...] = (
    "a photo of {}",
    "an image of {}",
    "a picture of {}",
    "{}",
    "{} in the scene",
    "a scene showing {}",
    "In this image, {}",
    "In the picture, {}",
    "This image shows {}",
)
COLORS = ("red", "blue", "green", "yellow", "black", "white", "brown", "gray", "orange", "pink", "purple")
COUNTS = ("one", "two", "three", "four", "five")
OBJECTS = ("dog", "cat", "horse", "car", "bus", "train", "person", "bird", "boat", "bicycle", "truck")
FLIP_LISTS: dict[str, tuple[str, ...]] = {"color": COLORS, "count": COUNTS, "object": OBJECTS}
K_SAME = 6
K_DIFF = 6
MIN_CHARS = 5


@dataclass(frozen=True)
class Flip:
    text: str
    type: str  # "color" | "count" | "object" | a user list's name
    old: str
    new: str


@dataclass(frozen=True)
class Variants:
    """Paraphrases and flips of one caption."""

    original: str
    paraphrases: tuple[str, ...]
    flips: tuple[Flip, ...]


def paraphrases(
    caption: str,
    *,
    templates: Sequence[str] = TEMPLATES,
    k_same: int | None = K_SAME,
    min_chars: int = MIN_CHARS,
    rng: random.Random | None = None,
) -> tuple[str, ...]:
    """Template/prefix paraphrases of ``caption`` (see module docstring)."""
    orig = caption.strip()
    out: list[str] = []
    for t in templates:
        s = t.format(orig).strip()
        if len(s) < min_chars or s == orig or s in out:
            continue
        out.append(s)
    if k_same is not None and len(out) > k_same:
        rng = rng or random.Random(0)
        keep = set(rng.sample(range(len(out)), k_same))
        out = [s for i, s in enumerate(out) if i in keep]
    return tuple(out)


def flips(
    caption: str,
    *,
    lists: Mapping[str, Sequence[str]] = FLIP_LISTS,
    k_diff: int | None = K_DIFF,
    per_type: int | None = 1,
    ignore_case: bool = False,
    min_chars: int = MIN_CHARS,
    rng: random.Random | None = None,
) -> tuple[Flip, ...]:
    """One-word semantic flips of ``caption`` (see module docstring)."""
    rng = rng or random.Random(0)
    orig = caption.strip()
    out: list[Flip] = []
    seen = {orig}
    for ftype, words in lists.items():
        words = [w for w in dict.fromkeys(words) if w]
        if len(words) < 2:
            continue
        pattern = re.compile(
            r"\b(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r")\b",
            re.IGNORECASE if ignore_case else 0,
        )
        m = pattern.search(orig)
        if not m:
            continue
        old = m.group(1)
        others = [w for w in words if w.lower() != old.lower()] if ignore_case else [w for w in words if w != old]
        chosen = others if per_type is None else (rng.sample(others, min(per_type, len(others))))
        for new in chosen:
            text = orig[: m.start(1)] + new + orig[m.end(1) :]
            if len(text) < min_chars or text in seen:
                continue
            seen.add(text)
            out.append(Flip(text, ftype, old, new))
    if k_diff is not None and len(out) > k_diff:
        keep = set(rng.sample(range(len(out)), k_diff))
        out = [f for i, f in enumerate(out) if i in keep]
    return tuple(out)


def lgip_variants(
    caption: str,
    *,
    seed: int = 0,
    extra_lists: Mapping[str, Sequence[str]] | None = None,
    lists: Mapping[str, Sequence[str]] | None = None,
    templates: Sequence[str] = TEMPLATES,
    k_same: int | None = K_SAME,
    k_diff: int | None = K_DIFF,
    per_type: int | None = 1,
    ignore_case: bool = False,
) -> Variants:
    """Paraphrases and flips of one caption with its own seeded generator.

    ``lists`` replaces the default color/count/object lists; ``extra_lists``
    adds user lists (name -> words) to them.
    """
    rng = random.Random(f"{seed}|lgip|{caption}")
    all_lists = dict(FLIP_LISTS if lists is None else lists)
    all_lists.update(extra_lists or {})
    para = paraphrases(caption, templates=templates, k_same=k_same, rng=rng)
    fl = flips(caption, lists=all_lists, k_diff=k_diff, per_type=per_type, ignore_case=ignore_case, rng=rng)
    return Variants(caption.strip(), para, fl)
