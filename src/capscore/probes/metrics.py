"""Probe metrics as pure functions on similarity tables (numpy in, floats/dataclasses out).

Ties count as failures everywhere (a strict ``>``), as in Winoground and
SugarCrepe; NaN similarities (an unreadable image recorded as an error) make a
comparison invalid and are counted in ``n_invalid``, never dropped silently.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from capscore.errors import param_error


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# ============================================================================ LGIP (Lee, 2025, sec. 3.3)
LGIP_AVERAGES = ("pairs", "captions")


@dataclass(frozen=True)
class FlipStats:
    """Semantic sensitivity: gap = s(orig) - s(flip); PR (positive rate) = share of gaps > 0."""

    gap_mean: float
    positive_rate: float
    count: int  # flips (pairs)
    n_captions: int = 0  # captions with at least one flip


def _check_average(average: str, func: str) -> None:
    if average not in LGIP_AVERAGES:
        raise param_error("average", func, "'pairs' (reference code) or 'captions' (eqs. 4, 6, 8)", average)


def _lgip_mean(values: np.ndarray, owner: np.ndarray, average: str) -> float:
    """Mean over pairs (flat), or the mean over captions of each caption's mean (nested)."""
    if values.size == 0:
        return float("nan")
    if average == "pairs":
        return float(values.mean())
    return float(np.mean([values[owner == o].mean() for o in dict.fromkeys(owner.tolist())]))


def invariance_error(orig: Sequence[float], para: Sequence[float], owner: Sequence[int], *,
                     average: str = "pairs") -> float:
    """LGIP invariance error E_inv (eq. 4): |s(I, c) - s(I, c')| averaged over paraphrases.

    ``orig[i]`` is the score of original caption i with its image; ``para[j]`` the
    score of paraphrase j, which belongs to caption ``owner[j]``.
    ``average="pairs"`` (default): one mean over all (caption, paraphrase) pairs -- the
    reference code (``run_lgip_multi.py`` extends one list over all pairs) and §4.1:
    "all reported numbers are averages over valid image-caption-flip triples".
    ``average="captions"``: eq. 4 as printed, E_(I,c) E_(c' in P(I,c)): the mean over
    captions (with at least one paraphrase) of each caption's mean.
    """
    _check_average(average, "invariance_error")
    o, p, ow = _arr(orig), _arr(para), np.asarray(owner, dtype=int)
    if p.size == 0:
        return float("nan")
    return _lgip_mean(np.abs(o[ow] - p), ow, average)


def flip_sensitivity(orig: Sequence[float], flip: Sequence[float], owner: Sequence[int], *,
                     average: str = "pairs") -> FlipStats:
    """LGIP semantic sensitivity E_sens (eqs. 5-6): mean gap s(I, c) - s(I, flip), and the
    positive rate PR (eqs. 7-8): mean of 1[s(I, c) > s(I, flip)] (a tie is not positive).
    ``average`` as in :func:`invariance_error` (default: over all flips, as the reference code)."""
    _check_average(average, "flip_sensitivity")
    o, f, ow = _arr(orig), _arr(flip), np.asarray(owner, dtype=int)
    if f.size == 0:
        return FlipStats(float("nan"), float("nan"), 0, 0)
    gaps = o[ow] - f
    return FlipStats(_lgip_mean(gaps, ow, average), _lgip_mean((gaps > 0).astype(float), ow, average),
                     int(gaps.size), len(set(ow.tolist())))


def flip_sensitivity_by_type(
    orig: Sequence[float], flip: Sequence[float], owner: Sequence[int], types: Sequence[str], *,
    average: str = "pairs",
) -> dict[str, FlipStats]:
    """:func:`flip_sensitivity` per flip type ("color", "count", "object", user lists)."""
    f, ow, ty = _arr(flip), np.asarray(owner, dtype=int), np.asarray(types, dtype=object)
    return {t: flip_sensitivity(orig, f[ty == t], ow[ty == t], average=average) for t in dict.fromkeys(types)}


# ============================================================================ SPECS specificity rate
SR_VARIANTS = ("capscore", "reference")


@dataclass(frozen=True)
class SpecificityRate:
    """One specificity rate (SR_pos or SR_neg), triplet-level and per image, with counts.

    ``triplets`` is SPECS eqs. 1-2 as printed: (1/N) sum over the N valid triplets of
    the indicator, all images pooled (micro). ``images`` is the mean over images of
    each image's rate over its own steps (macro), as the SPECS reference evaluation
    computes it. An image with fewer than ``min_steps`` valid steps is *skipped* from
    the per-image mean (and, in the reference variant, from both): counted in
    ``n_skipped``, never dropped silently.
    """

    triplets: float
    images: float
    n_triplets: int  # valid triplets in the triplet-level rate
    n_correct: int
    n_images: int  # images that entered the per-image mean
    n_skipped: int  # images with fewer than ``min_steps`` valid steps
    per_image: tuple[float, ...] = field(repr=False, default=())


def step_rate(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]], *, want_increase: bool,
              min_steps: int = 1, skip_in_triplets: bool = False) -> SpecificityRate:
    """Per image, the valid (finite) steps k with after[k] > before[k] (``want_increase``)
    or before[k] > after[k]; pooled over images (triplet-level) and averaged per image
    over images with at least ``min_steps`` valid steps. ``skip_in_triplets`` also
    leaves a skipped image's steps out of the triplet-level rate.

    SR_pos: before = s(prefix_k), after = s(prefix_k + correct unit k+1), want_increase.
    SR_neg: before = s(prefix_k), after = s(prefix_k + wrong unit), not want_increase
    (prose of SPECS §3.2: "adding an irrelevant detail ... decreases the similarity";
    eq. 2 prints the inequality the other way round, which contradicts it).
    """
    if len(before) != len(after):
        raise ValueError("before and after must hold one list per image")
    rates, skipped, n_trip, n_ok = [], 0, 0, 0
    for b, a in zip(before, after):
        b, a = _arr(b), _arr(a)
        if b.shape != a.shape:
            raise ValueError("before and after must have one value per step")
        ok = np.isfinite(b) & np.isfinite(a)
        good = (a[ok] > b[ok]) if want_increase else (b[ok] > a[ok])
        n = int(ok.sum())
        if n < min_steps or n == 0:
            skipped += 1
            if skip_in_triplets:
                continue
        else:
            rates.append(float(good.mean()))
        n_trip += n
        n_ok += int(good.sum())
    return SpecificityRate(n_ok / n_trip if n_trip else float("nan"), float(np.mean(rates)) if rates else float("nan"),
                           n_trip, n_ok, len(rates), skipped, tuple(rates))


@dataclass(frozen=True)
class SpecificityRates:
    pos: SpecificityRate
    neg: SpecificityRate
    variant: str
    n_images: int  # images given

    @property
    def mean_triplets(self) -> float:
        return (self.pos.triplets + self.neg.triplets) / 2

    @property
    def mean_images(self) -> float:
        return (self.pos.images + self.neg.images) / 2


def reference_chain(prefix: Sequence[float], wrong: Sequence[float]) -> tuple[list[float], list[float], list[float]]:
    """The steps the SPECS reference evaluation counts in one image's score chain.

    The authors' ``evaluation/intrinsic/scripts/specs.py`` stores, per image, the pairs (s(P_t), s(P_t + d⁻_t))
    of its prefixes and negative captions in a zero-padded array; there are K prefixes and K − 1 negatives, and
    the pairs are zipped, so **s(P_K) is never stored**. Its ``compute_increments``
    (``evaluation/intrinsic/metric.py``) then takes m = the number of stored prefix scores > 0, wherever they
    stand, and n = m − 1 steps from the start of the stored chain: SR_pos compares s(P_{t+1}) > s(P_t) and
    SR_neg s(P_t) > s(P_t + d⁻_t), for t = 1..n, scores ≤ 0 inside the chain taken as they are (a prefix score
    −0.01 is a value; a negative score −0.05 counts as lower). An image with n < 2 is skipped (``n > 1``).

    ``prefix`` = [s(P_1), …, s(P_K)]; ``wrong`` = [s(P_1 + d⁻_1), …] (NaN where no negative exists: the chain
    stored ends at the first such step, as the zip ends with the shorter list). Returns the n steps as
    (s(P_t), s(P_{t+1}), s(P_t + d⁻_t)) lists; fewer than 2 steps means the image is skipped.
    Example: prefixes [.2, .25, .3, .35, −.01] with negatives [.1, .3, .2, .4]: stored [.2, .25, .3, .35],
    m = 4, n = 3 steps; SR_neg = 2/3 (s(P_5) = −.01 is never read).
    """
    p, w = _arr(prefix), _arr(wrong)
    stored = min(max(len(p) - 1, 0), len(w))
    finite = np.isfinite(w[:stored])
    if not finite.all():
        stored = int(np.argmin(finite))  # the first step without a negative ends the stored chain
    p, w = p[:stored], w[:stored]
    n = int((p > 0).sum()) - 1
    if n < 1:
        return [], [], []
    return p[:n].tolist(), p[1 : n + 1].tolist(), w[:n].tolist()


def specificity_rates(prefix_scores: Sequence[Sequence[float]], wrong_scores: Sequence[Sequence[float]], *,
                      variant: str = "capscore", min_steps: int | None = None) -> SpecificityRates:
    """SR_pos and SR_neg (SPECS §3.2, eqs. 1-2) from per-image score chains.

    ``prefix_scores[i]`` = [s(P_1), ..., s(P_K)] for the K prefixes of image i's caption
    (P_k = units 1..k). ``wrong_scores[i]`` = [s(P_1 + w_1), ..., s(P_{K-1} + w_{K-1})]
    (NaN where no wrong unit exists). Steps: k = 1..K-1.

    ``variant="capscore"`` (default): every step, every image in the triplet-level rate (a step without a wrong
    score is no SR_neg triplet); ``min_steps`` (default 1) for the per-image mean. ``variant="reference"``: the
    SPECS reference evaluation's steps (:func:`reference_chain`: s(P_K) never stored, n = number of positive
    stored prefix scores − 1 steps, scores ≤ 0 inside taken as they are) and images with fewer than
    ``min_steps`` (default 2, the reference's ``n > 1``) steps skipped from both rates.
    """
    if variant not in SR_VARIANTS:
        raise param_error("variant", "specificity_rates", "'capscore' or 'reference'", variant)
    if variant == "reference":
        min_steps = 2 if min_steps is None else min_steps
        chains = [reference_chain(p, w) for p, w in zip(prefix_scores, wrong_scores)]
        chains = [c if len(c[0]) >= min_steps else ([], [], []) for c in chains]  # kept or skipped as a whole
        before, after_pos, wrong = ([c[j] for c in chains] for j in range(3))
        skip = True
    else:
        min_steps, skip = 1 if min_steps is None else min_steps, False
        before = [list(p)[:-1] for p in prefix_scores]
        after_pos = [list(p)[1:] for p in prefix_scores]
        wrong = [list(w)[: len(b)] + [float("nan")] * (len(b) - len(w)) for w, b in zip(wrong_scores, before)]
    pos = step_rate(before, after_pos, want_increase=True, min_steps=min_steps, skip_in_triplets=skip)
    neg = step_rate(before, wrong, want_increase=False, min_steps=min_steps, skip_in_triplets=skip)
    return SpecificityRates(pos, neg, variant, len(before))


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
