"""Probe metrics as pure functions on similarity tables (numpy in, floats/dataclasses out).

Ties count as failures everywhere (a strict ``>``), as in Winoground and
SugarCrepe; NaN similarities (an unreadable image recorded as an error) make a
comparison invalid and are counted in ``n_invalid``, never dropped silently.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# ============================================================================ LGIP (Lee, 2025, sec. 3.3)
@dataclass(frozen=True)
class FlipStats:
    """Semantic sensitivity: gap = s(orig) - s(flip); PR (positive rate) = share of gaps > 0."""

    gap_mean: float
    positive_rate: float
    count: int


def invariance_error(orig: Sequence[float], para: Sequence[float], owner: Sequence[int]) -> float:
    """LGIP invariance error: mean over (caption, paraphrase) pairs of |s(I, c) - s(I, c')|.

    ``orig[i]`` is the score of original caption i with its image; ``para[j]`` the
    score of paraphrase j, which belongs to caption ``owner[j]``.
    """
    o, p = _arr(orig), _arr(para)
    if p.size == 0:
        return float("nan")
    return float(np.mean(np.abs(o[np.asarray(owner, dtype=int)] - p)))


def flip_sensitivity(orig: Sequence[float], flip: Sequence[float], owner: Sequence[int]) -> FlipStats:
    """LGIP semantic sensitivity: mean gap s(I, c) - s(I, flip) and positive rate P(gap > 0)."""
    o, f = _arr(orig), _arr(flip)
    if f.size == 0:
        return FlipStats(float("nan"), float("nan"), 0)
    gaps = o[np.asarray(owner, dtype=int)] - f
    return FlipStats(float(gaps.mean()), float((gaps > 0).mean()), int(gaps.size))


def flip_sensitivity_by_type(
    orig: Sequence[float], flip: Sequence[float], owner: Sequence[int], types: Sequence[str]
) -> dict[str, FlipStats]:
    """:func:`flip_sensitivity` per flip type ("color", "count", "object", user lists)."""
    f, ow, ty = _arr(flip), np.asarray(owner, dtype=int), np.asarray(types, dtype=object)
    return {t: flip_sensitivity(orig, f[ty == t], ow[ty == t]) for t in dict.fromkeys(types)}


# ============================================================================ SPECS specificity rate
@dataclass(frozen=True)
class SpecificityRate:
    """Share of steps going the right way, averaged per image (images with too few steps skipped)."""

    rate: float
    n_images: int  # images that entered the mean
    n_skipped: int  # images with fewer than ``min_steps`` valid steps
    n_steps: int  # valid steps in the counted images
    per_image: tuple[float, ...] = field(repr=False, default=())


def step_rate(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]], *, want_increase: bool,
              min_steps: int = 2) -> SpecificityRate:
    """Per image, the share of valid steps k with after[k] > before[k] (``want_increase``)
    or before[k] > after[k]; then the mean over images with at least ``min_steps``
    valid (finite) steps.

    SR_pos: before = s(prefix_k), after = s(prefix_k + correct unit k+1), want_increase.
    SR_neg: before = s(prefix_k), after = s(prefix_k + wrong unit), not want_increase.
    The SPECS paper skips images with <= 1 step, hence ``min_steps=2``.
    """
    if len(before) != len(after):
        raise ValueError("before and after must hold one list per image")
    rates, skipped, steps = [], 0, 0
    for b, a in zip(before, after):
        b, a = _arr(b), _arr(a)
        if b.shape != a.shape:
            raise ValueError("before and after must have one value per step")
        ok = np.isfinite(b) & np.isfinite(a)
        n = int(ok.sum())
        if n < min_steps:
            skipped += 1
            continue
        good = (a[ok] > b[ok]) if want_increase else (b[ok] > a[ok])
        rates.append(float(good.mean()))
        steps += n
    rate = float(np.mean(rates)) if rates else float("nan")
    return SpecificityRate(rate, len(rates), skipped, steps, tuple(rates))


def specificity_rates(prefix_scores: Sequence[Sequence[float]], wrong_scores: Sequence[Sequence[float]], *,
                      min_steps: int = 2) -> tuple[SpecificityRate, SpecificityRate, float]:
    """SR_pos, SR_neg and their mean from per-image score chains.

    ``prefix_scores[i]`` = [s(P_1), ..., s(P_K)] for the K prefixes of image i's
    caption (P_k = units 1..k). ``wrong_scores[i]`` = [s(P_1 + w_1), ..., s(P_{K-1} + w_{K-1})]
    (NaN where no wrong unit exists). Steps: k = 1..K-1.
    """
    before = [list(p)[:-1] for p in prefix_scores]
    after_pos = [list(p)[1:] for p in prefix_scores]
    pos = step_rate(before, after_pos, want_increase=True, min_steps=min_steps)
    neg = step_rate(before, [list(w) for w in wrong_scores], want_increase=False, min_steps=min_steps)
    return pos, neg, (pos.rate + neg.rate) / 2


# ============================================================================ compositional suites
def i2t_correct(S: np.ndarray, truth: Sequence[Sequence[int]] | None = None) -> bool:
    """Image-to-text: for every image i, each true caption outscores every other caption.

    ``S[i, c]`` = score(image i, caption c). ``truth[i]`` = indices of image i's
    true captions (default: the diagonal, ``[[0], [1], ...]``).
    """
    S = _arr(S)
    truth = truth if truth is not None else [[i] for i in range(S.shape[0])]
    for i, true in enumerate(truth):
        false = [c for c in range(S.shape[1]) if c not in true]
        if false and not (S[i, list(true)].min() > S[i, false].max()):
            return False
    return True


def t2i_correct(S: np.ndarray) -> bool:
    """Text-to-image (diagonal truth): for every caption c, its image outscores the other images."""
    S = _arr(S)
    for c in range(S.shape[1]):
        others = [i for i in range(S.shape[0]) if i != c]
        if others and not (S[c, c] > S[others, c].max()):
            return False
    return True


@dataclass(frozen=True)
class WinogroundScore:
    text: bool
    image: bool
    group: bool


def winoground(S: np.ndarray) -> WinogroundScore:
    """Winoground (Thrush et al., 2022, sec. 3): S[i, c] for images i0, i1 and captions c0, c1.

    text  = s(c0,i0) > s(c1,i0) and s(c1,i1) > s(c0,i1)
    image = s(c0,i0) > s(c0,i1) and s(c1,i1) > s(c1,i0)
    group = text and image
    """
    t, im = i2t_correct(S), t2i_correct(S)
    return WinogroundScore(t, im, t and im)


def sugarcrepe_pp_tot(p1p2: float, p1n: float, p2n: float) -> bool:
    """SugarCrepe++ text-only (TOT): cos(p1, p2) exceeds both cos(p1, n) and cos(p2, n)."""
    return p1p2 > p1n and p1p2 > p2n


@dataclass(frozen=True)
class GroupAccuracy:
    """ARO-style macro accuracy over groups (relations, attribute pairs) with enough samples."""

    macro: float
    micro: float  # over all items
    n_groups: int  # groups that entered the macro mean
    excluded_groups: tuple[str, ...]  # fewer than min_count items
    per_group: dict = field(default_factory=dict)  # group -> (accuracy, count)


def macro_accuracy(correct: Sequence[bool], groups: Sequence[str], *, min_count: int = 25) -> GroupAccuracy:
    """Mean of per-group accuracies over groups with >= ``min_count`` items (ARO, Yuksekgonul
    et al., 2023, sec. 3: relations / attribute pairs with fewer samples are left out)."""
    c = np.asarray(correct, dtype=bool)
    g = np.asarray(groups, dtype=object)
    per = {k: (float(c[g == k].mean()), int((g == k).sum())) for k in dict.fromkeys(groups)}
    kept = [acc for acc, n in per.values() if n >= min_count]
    excluded = tuple(k for k, (_, n) in per.items() if n < min_count)
    return GroupAccuracy(float(np.mean(kept)) if kept else float("nan"), float(c.mean()) if c.size else float("nan"),
                         len(kept), excluded, per)
