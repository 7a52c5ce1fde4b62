"""Agreement statistics between a metric and human (or oracle) judgments — pure functions on arrays.

Every statistic is reported in points (×100), as the captioning-metric papers
report them: Kendall τ ×100, Pearson r ×100, accuracy in %, and the fitted
1 − R² ×100 (the percentage of the human-score variance a linear fit of the
metric leaves unexplained) — with one exception, ``one_minus_r2``, which is
printed ×1 as SPECS Table 2 prints it (see below). The computations are scipy's
(and, for ``one_minus_r2``, the textbook residual-sum-of-squares ratio that
scikit-learn's ``r2_score`` computes); this module only validates the inputs,
scales, groups and bootstraps.

=====================  ======================================================================
``tau_b`` / ``tau_c``  Kendall τ-b / τ-c (``scipy.stats.kendalltau``, ties as scipy handles
                       them). Flickr8k-Expert and Composite report τ-c, Flickr8k-CF τ-b
                       (Hessel et al. 2021, appendix A; Sarto et al. 2023).
``pearson``            Pearson r (``scipy.stats.pearsonr``).
``spearman``           Spearman ρ (``scipy.stats.spearmanr``).
``one_minus_r2``       DeCapBench / SPECS Table 2 "1 − R²": 1 − R² with R² the *unfitted*
                       coefficient of determination of the metric scores taken as predictions
                       of the human scores, R² = 1 − Σ(h − m)² / Σ(h − h̄)² (scikit-learn's
                       ``r2_score(human, metric)``), so 1 − R² = Σ(h − m)² / Σ(h − h̄)²,
                       unbounded above. Scale ×1 (not points), as the table prints it: its
                       values 3.65 (SPECS), 1.54 (DCScore), 156.05 (ROUGE), 3.30E+07 (CIDEr)
                       cannot be ×100 fractions — 1 − R² ×100 ≥ 100·(1 − ρ²), which would be
                       ≥ 72.7 for SPECS's ρ = 0.5228. Metric scores enter as they come (no
                       rescaling), so the value depends on the metric's scale (CLIP-S w = 2.5).
``one_minus_r2_fit``   1 − R² of the least-squares line human ~ metric (``linregress``) ×100,
                       i.e. 100·(1 − r²) ∈ [0, 100]: the share of human-score variance a
                       linear fit of the metric leaves unexplained.
``sample_tau``         sample-wise τ: τ within each group (image), averaged over groups
                       ("Sp τ" of DeCapBench / SPECS). Groups with < 2 items or a constant
                       metric or human score inside the group have no τ and are left out of
                       the mean (scipy returns NaN for them; the papers' nan-mean does the same);
                       how many were left out is reported.
``pairwise_accuracy``  share of pairs where the metric prefers the human-preferred caption
                       (Pascal-50S; FOIL with the original always preferred). A pair the metric
                       scores equal counts ``ties="half"`` (0.5) or ``ties="loss"`` (0).
``system_level``       per-system means of metric and human score, then a correlation across
                       systems (``kind`` = tau_b / tau_c / pearson / spearman).
=====================  ======================================================================

Invalid inputs are user errors: different lengths, NaN/inf, fewer than two items,
or a constant input (for which a correlation is undefined: scipy would return NaN)
raise :class:`~capscore.errors.CapscoreError` saying which input, never NaN.

Confidence intervals are percentile bootstrap intervals from ``scipy.stats.bootstrap``
with a seeded generator: items resampled with replacement (paired metric/human),
groups resampled for ``sample_tau``, pairs resampled *within* each category for
the mean of per-category accuracies (a stratified bootstrap). A resample on which
the statistic is undefined (e.g. constant) yields NaN; if any does, the interval is
not reported (``None``) rather than silently computed from the rest.

``hierarchical_bootstrap`` is the interval for a mean over *training runs* (top-level units, e.g.
seeds) of per-run means over items that come in clusters (all items of one image): resample the
runs, then the clusters within each drawn run, with the run effects shrunk so that the bootstrap
variance is not inflated by counting the item noise twice (Davison & Hinkley 1997, §3.8).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

from capscore.errors import CapscoreError, unknown_name
from capscore.meta import MAX_RESAMPLES

CORRELATIONS = ("tau_b", "tau_c", "pearson", "spearman", "one_minus_r2", "one_minus_r2_fit")
#: Statistics reported on their own scale (×1) rather than in points (×100).
UNSCALED = frozenset({"one_minus_r2"})


@dataclass(frozen=True)
class Stat:
    """One reported number: ``value`` in points (×100; ×1 for the names in :data:`UNSCALED`), its
    bootstrap interval, and how many items."""

    name: str
    value: float
    ci: tuple[float, float] | None = None
    n: int = 0
    note: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value,
                "ci_low": None if self.ci is None else self.ci[0],
                "ci_high": None if self.ci is None else self.ci[1], "n": self.n, "note": self.note}


# ------------------------------------------------------------------------------------ validation
def _vector(x, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1:
        raise CapscoreError(f"{what} must be a 1-D sequence of numbers; got shape {a.shape}")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise CapscoreError(f"{what} has a non-finite value (NaN or inf) at position {int(bad[0])}")
    return a


def _paired(metric, human, *, names=("metric scores", "human scores"), min_n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    x, y = _vector(metric, names[0]), _vector(human, names[1])
    if x.shape != y.shape:
        raise CapscoreError(f"{names[0]} and {names[1]} differ in length: {x.size} vs {y.size}")
    if x.size < min_n:
        raise CapscoreError(f"a correlation needs at least {min_n} items; got {x.size}")
    for a, what in ((x, names[0]), (y, names[1])):
        if a.min() == a.max():  # not np.ptp: max - min overflows for scores near ±1e308
            raise CapscoreError(f"{what} are constant (all {a[0]:g}): a correlation is undefined")
    return x, y


# ------------------------------------------------------------------------------------ correlations
def _raw(kind: str, x: np.ndarray, y: np.ndarray) -> float:
    """The statistic ×100 on already-validated arrays (NaN if scipy finds it undefined)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant resamples: NaN is handled by the caller
        if kind == "tau_b":
            return 100 * float(st.kendalltau(x, y, variant="b").statistic)
        if kind == "tau_c":
            return 100 * float(st.kendalltau(x, y, variant="c").statistic)
        if kind == "pearson":  # r is scale-free: unit scale keeps scores near ±1e308 from overflowing
            return 100 * float(st.pearsonr(unit_scale(x), unit_scale(y)).statistic)
        if kind == "spearman":
            return 100 * float(st.spearmanr(x, y).statistic)
        if kind == "one_minus_r2":
            return unfitted_one_minus_r2(x, y)
        if kind == "one_minus_r2_fit":
            if np.ptp(x) == 0:  # a constant bootstrap resample: linregress raises instead of giving NaN
                return float("nan")
            return 100 * (1 - float(st.linregress(unit_scale(x), unit_scale(y)).rvalue) ** 2)
    raise unknown_name("statistic", kind, CORRELATIONS)


def unit_scale(a: np.ndarray) -> np.ndarray:
    """``a`` divided by its largest magnitude (a correlation is unchanged by it; scores near ±1e308 then no
    longer overflow the sums of squares a correlation is made of)."""
    top = float(np.abs(a).max()) if a.size else 0.0
    return a / top if top > 0 else a


def _defined(value: float, kind: str) -> float:
    """A statistic as reported: finite, or a one-line error (never NaN or inf printed as a result)."""
    if not np.isfinite(value):
        raise CapscoreError(f"{kind} is not a finite number on these scores ({value}): the scores are too large "
                            "for 64-bit arithmetic (near ±1e308); rescale them")
    return value


def correlation(metric, human, *, kind: str = "tau_c") -> float:
    """One of :data:`CORRELATIONS` ×100 between metric and human scores."""
    if kind not in CORRELATIONS:
        raise unknown_name("statistic", kind, CORRELATIONS)
    x, y = _paired(metric, human)
    return _defined(_raw(kind, x, y), kind)


def kendall_tau(metric, human, *, variant: str = "c") -> float:
    """Kendall τ-b or τ-c ×100 (scipy's tie handling)."""
    if variant not in ("b", "c"):
        raise CapscoreError(f"The 'variant' parameter of kendall_tau must be 'b' or 'c'; got {variant!r} instead.")
    return correlation(metric, human, kind=f"tau_{variant}")


def pearson(metric, human) -> float:
    return correlation(metric, human, kind="pearson")


def spearman(metric, human) -> float:
    return correlation(metric, human, kind="spearman")


def unfitted_one_minus_r2(metric: np.ndarray, human: np.ndarray) -> float:
    """Σ(h − m)² / Σ(h − h̄)² on validated arrays: 1 − R² with R² = ``r2_score(y_true=human, y_pred=metric)``.

    DeCapBench's "1 − R²" as SPECS Table 2 reports it (×1). A metric that predicts every human
    score exactly gives 0; one that predicts the human mean gives 1; anything worse, more than 1.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by the caller, not warned about
        return float(np.sum((human - metric) ** 2) / np.sum((human - human.mean()) ** 2))


def one_minus_r2(metric, human) -> float:
    """SPECS Table 2 "1 − R²" (×1, unbounded): Σ(h − m)² / Σ(h − h̄)², metric scores as predictions of
    human scores with no fitted line (scikit-learn's ``1 - r2_score(human, metric)``)."""
    return correlation(metric, human, kind="one_minus_r2")


def one_minus_r2_fit(metric, human) -> float:
    """1 − r² ×100 of the least-squares line human ≈ a + b·metric (in [0, 100])."""
    return correlation(metric, human, kind="one_minus_r2_fit")


# ------------------------------------------------------------------------------------ sample-wise τ
def _group_index(groups: Sequence, n: int) -> list[np.ndarray]:
    if len(groups) != n:
        raise CapscoreError(f"groups and scores differ in length: {len(groups)} vs {n}")
    by: dict = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    return [np.asarray(v) for v in by.values()]


def _group_taus(x: np.ndarray, y: np.ndarray, index: list[np.ndarray], variant: str) -> np.ndarray:
    out = np.full(len(index), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, idx in enumerate(index):
            if idx.size >= 2 and np.ptp(x[idx]) > 0 and np.ptp(y[idx]) > 0:
                out[k] = st.kendalltau(x[idx], y[idx], variant=variant).statistic
    return out


def sample_tau(metric, human, groups: Sequence, *, variant: str = "b") -> tuple[float, int, int]:
    """Mean over groups of the within-group Kendall τ ×100 -> (value, groups used, groups left out)."""
    x, y = _vector(metric, "metric scores"), _vector(human, "human scores")
    if x.shape != y.shape:
        raise CapscoreError(f"metric scores and human scores differ in length: {x.size} vs {y.size}")
    taus = _group_taus(x, y, _group_index(groups, x.size), variant)
    used = int(np.isfinite(taus).sum())
    if used == 0:
        raise CapscoreError("sample-wise τ is undefined: no group has two or more items with "
                            "non-constant metric and human scores")
    return 100 * float(np.nanmean(taus)), used, int(taus.size - used)


# ------------------------------------------------------------------------------------ pairs
def pair_outcomes(score_a, score_b, label, *, ties: str = "half") -> np.ndarray:
    """Per pair: 1 if the metric prefers the human-preferred caption (label 0 = a, 1 = b), 0 if not,
    0.5 (``ties="half"``) or 0 (``ties="loss"``) if the metric scores both equal."""
    a, b = _vector(score_a, "scores of caption A"), _vector(score_b, "scores of caption B")
    lab = np.asarray(label)
    if not (a.shape == b.shape == lab.shape):
        raise CapscoreError(f"pair arrays differ in length: {a.size}, {b.size}, {lab.size}")
    if not np.isin(lab, (0, 1)).all():
        raise CapscoreError("pair labels must be 0 (caption A preferred) or 1 (caption B preferred)")
    if ties not in ("half", "loss"):
        raise CapscoreError(f"The 'ties' parameter must be 'half' or 'loss'; got {ties!r} instead.")
    prefers_b = b > a
    out = (prefers_b == (lab == 1)).astype(float)
    out[a == b] = 0.5 if ties == "half" else 0.0
    return out


def pairwise_accuracy(score_a, score_b, label, *, ties: str = "half") -> float:
    """Share (%) of pairs where the metric prefers the caption humans preferred."""
    out = pair_outcomes(score_a, score_b, label, ties=ties)
    if out.size == 0:
        raise CapscoreError("pairwise accuracy needs at least one pair")
    return 100 * float(out.mean())


def accuracy_by_category(score_a, score_b, label, categories: Sequence[str], *, ties: str = "half",
                         order: Sequence[str] | None = None) -> dict[str, float]:
    """Accuracy (%) per category plus ``mean``: the unweighted mean of the category accuracies
    (the "Mean" column of the Pascal-50S tables)."""
    out = pair_outcomes(score_a, score_b, label, ties=ties)
    cats = np.asarray(categories)
    if cats.shape != out.shape:
        raise CapscoreError(f"categories and pairs differ in length: {cats.size} vs {out.size}")
    names = list(order) if order else sorted(set(cats.tolist()))
    res = {}
    for c in names:
        sel = out[cats == c]
        if sel.size:
            res[c] = 100 * float(sel.mean())
    if not res:
        raise CapscoreError("pairwise accuracy needs at least one pair")
    res["mean"] = float(np.mean([res[c] for c in names if c in res]))
    return res


# ------------------------------------------------------------------------------------ system level
def system_means(values, systems: Sequence[str]) -> dict[str, float]:
    v = _vector(values, "scores")
    if len(systems) != v.size:
        raise CapscoreError(f"systems and scores differ in length: {len(systems)} vs {v.size}")
    acc: dict[str, list[float]] = {}
    for s, x in zip(systems, v):
        acc.setdefault(str(s), []).append(x)
    return {s: float(np.mean(xs)) for s, xs in sorted(acc.items())}


def system_level(metric, human, systems: Sequence[str], *, kind: str = "pearson") -> tuple[float, int]:
    """Correlation ×100 between per-system mean metric and mean human scores -> (value, systems)."""
    m, h = system_means(metric, systems), system_means(human, systems)
    names = sorted(m)
    if len(names) < 2:
        raise CapscoreError(f"system-level correlation needs at least 2 systems; got {len(names)}")
    x, y = _paired([m[s] for s in names], [h[s] for s in names],
                   names=("per-system metric means", "per-system human means"))
    return _raw(kind, x, y), len(names)


# ------------------------------------------------------------------------------------ bootstrap
def bootstrap_ci(statistic: Callable[..., float], data: Sequence[np.ndarray], *, paired: bool = True,
                 n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic(*data)`` (scipy.stats.bootstrap, seeded).

    ``paired=True`` resamples the rows of all arrays together; ``paired=False``
    resamples each array on its own (used for a stratified bootstrap: one array
    per stratum). Returns ``None`` if ``n_resamples`` is 0 or the statistic was
    undefined on some resample.
    """
    if n_resamples <= 0:
        return None
    if n_resamples > MAX_RESAMPLES:
        raise CapscoreError(f"The 'n_resamples' parameter of bootstrap_ci must be at most {MAX_RESAMPLES:,}; "
                            f"got {n_resamples!r} instead.")
    if any(np.asarray(d).size < 2 for d in data):
        return None
    total = sum(np.asarray(d).size for d in data)
    # scipy draws all R x n resample indices at once unless batched; batches of ~16M indices bound the memory
    # (only for counts that need it: batching an unpaired bootstrap interleaves the samples' draws)
    batch = None if n_resamples * total <= 1 << 24 else max(1, (1 << 24) // total)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = st.bootstrap(tuple(np.asarray(d) for d in data), statistic, n_resamples=n_resamples,
                           paired=paired, vectorized=False, confidence_level=confidence,
                           method="percentile", rng=np.random.default_rng(seed), batch=batch)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(lo) and np.isfinite(hi)) or np.isnan(res.bootstrap_distribution).any():
        return None
    return lo, hi


def correlation_stat(metric, human, kind: str, *, n_resamples: int = 0, seed: int = 0,
                     confidence: float = 0.95) -> Stat:
    """``correlation`` with its bootstrap interval, as a :class:`Stat`."""
    if kind not in CORRELATIONS:
        raise unknown_name("statistic", kind, CORRELATIONS)
    x, y = _paired(metric, human)
    ci = bootstrap_ci(lambda a, b: _raw(kind, a, b), (x, y), n_resamples=n_resamples, seed=seed,
                      confidence=confidence)
    note = "x1, unfitted (SPECS Table 2 scale)" if kind in UNSCALED else ""
    return Stat(kind, _defined(_raw(kind, x, y), kind), ci, int(x.size), note)


def sample_tau_stat(metric, human, groups: Sequence, *, variant: str = "b", n_resamples: int = 0,
                    seed: int = 0, confidence: float = 0.95) -> Stat:
    """``sample_tau`` with a bootstrap over groups."""
    value, used, left = sample_tau(metric, human, groups, variant=variant)
    x, y = _vector(metric, "metric scores"), _vector(human, "human scores")
    taus = _group_taus(x, y, _group_index(groups, x.size), variant)
    taus = taus[np.isfinite(taus)]
    ci = bootstrap_ci(lambda t: 100 * float(np.mean(t)), (taus,), n_resamples=n_resamples, seed=seed,
                      confidence=confidence)
    note = f"{used} groups" + (f"; {left} without a defined τ left out" if left else "")
    return Stat(f"sample_tau_{variant}", value, ci, int(x.size), note)


def accuracy_stats(score_a, score_b, label, categories: Sequence[str] | None = None, *, ties: str = "half",
                   order: Sequence[str] | None = None, n_resamples: int = 0, seed: int = 0,
                   confidence: float = 0.95, name: str = "accuracy") -> list[Stat]:
    """Accuracy overall (no categories) or per category + mean, each with a bootstrap interval."""
    out = pair_outcomes(score_a, score_b, label, ties=ties)
    return outcome_stats(out, categories, order=order, n_resamples=n_resamples, seed=seed,
                         confidence=confidence, name=name)


def outcome_stats(outcomes, categories: Sequence[str] | None = None, *, order: Sequence[str] | None = None,
                  n_resamples: int = 0, seed: int = 0, confidence: float = 0.95,
                  name: str = "accuracy") -> list[Stat]:
    """Accuracy (%) from per-pair outcomes in [0, 1] (e.g. averaged over reference draws): overall as
    ``name``, or per category plus ``mean`` (unweighted mean of the categories; its interval comes
    from a bootstrap stratified by category)."""
    out = _vector(outcomes, "pair outcomes")
    if out.size == 0:
        raise CapscoreError("pairwise accuracy needs at least one pair")
    pct = lambda s: 100 * float(np.mean(s))  # noqa: E731
    if categories is None:
        ci = bootstrap_ci(pct, (out,), n_resamples=n_resamples, seed=seed, confidence=confidence)
        return [Stat(name, pct(out), ci, int(out.size))]
    cats = np.asarray(categories)
    if cats.shape != out.shape:
        raise CapscoreError(f"categories and pairs differ in length: {cats.size} vs {out.size}")
    names = [c for c in (list(order) if order else sorted(set(cats.tolist()))) if (cats == c).any()]
    strata = [out[cats == c] for c in names]
    res = [Stat(c, pct(s), bootstrap_ci(pct, (s,), n_resamples=n_resamples, seed=seed, confidence=confidence),
                int(s.size)) for c, s in zip(names, strata)]
    mean_ci = bootstrap_ci(lambda *s: float(np.mean([pct(x) for x in s])), strata, paired=False,
                           n_resamples=n_resamples, seed=seed, confidence=confidence)
    res.append(Stat("mean", float(np.mean([r.value for r in res])), mean_ci, int(out.size),
                    "unweighted mean of the category accuracies"))
    return res


# ------------------------------------------------------------------------------------ hierarchical
@dataclass(frozen=True)
class HierarchicalCI:
    """A mean over top-level units (training runs) of per-unit item means, with its hierarchical
    bootstrap interval and standard error, and the variance components it was built from."""

    estimate: float
    low: float
    high: float
    se: float
    units: int
    clusters: int
    items: int
    between: float  # B: sample variance (ddof 1) of the unit means; NaN with one unit
    within: float  # W: mean over units of the estimated variance of a unit's mean over its clusters
    shrink: float  # c: factor applied to the unit effects (1 = none)


def _unit(values, clusters, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Cluster totals and sizes of unit ``k`` (a cluster = all items with one label)."""
    v = _vector(values, f"values of unit {k}")
    if v.size == 0:
        raise CapscoreError(f"unit {k} has no items")
    if clusters is None:
        return v, np.ones_like(v)
    labels = np.asarray(clusters)
    if labels.shape != v.shape:
        raise CapscoreError(f"unit {k}: clusters and values differ in length: {labels.size} vs {v.size}")
    _, inv = np.unique(labels, return_inverse=True)
    return np.bincount(inv, weights=v), np.bincount(inv).astype(float)


def hierarchical_bootstrap(values: Sequence, clusters: Sequence | None = None, *, n_resamples: int = 2000,
                           seed: int = 0, confidence: float = 0.95, adjust: bool = True) -> HierarchicalCI:
    """Two-stage percentile bootstrap of the mean over units of per-unit item means.

    ``values[s]`` are the item values of top-level unit ``s`` (one training run, e.g. one seed);
    ``clusters[s]`` (optional) labels each item with its cluster (the image it belongs to; items of
    one cluster are not independent and are resampled together). Without ``clusters`` every item is
    its own cluster. The estimate is ``mean_s(m_s)`` with ``m_s`` unit ``s``'s mean over its items
    (units weigh equally, items within a unit equally).

    One resample draws ``S`` units with replacement and, for each drawn unit independently, its
    ``n_s`` clusters with replacement (all items of a drawn cluster come along); the unit's value is
    the item mean of the drawn clusters. Resampling at both stages counts the item noise twice: the
    spread of the unit means already contains it. For equal cluster sizes the plain scheme
    (``adjust=False``) has bootstrap variance

        ((S − 1)/S²)·B + (1/S)·mean_s((n_s − 1)/n_s · W_s),

    with ``B`` the sample variance (ddof 1) of the unit means, whose expectation is σ²_unit + σ²_c/n,
    and ``W_s`` = s²_c/n_s the unbiased variance of unit ``s``'s mean over its clusters. So it
    understates the run-to-run part by (S − 1)/S and adds the item part a second time.
    ``adjust=True`` (the default) follows Davison & Hinkley (1997, §3.8, the adjusted two-stage
    scheme): the unit effects are shrunk, ``m + c·(m_s − m)`` with
    ``c² = S/(S − 1)·max(0, 1 − W/B)`` (``W`` = mean of the ``W_s``), and each unit's
    within-resample deviation is scaled by ``sqrt(n_s/(n_s − 1))``; the bootstrap variance is then

        max(B, W) / S,

    i.e. ``B/S`` — the unbiased estimate of the variance of the grand mean under the one-way
    random-effects model — unless the units agree more closely than their items alone predict, when
    the item part ``W/S`` is the floor. With one unit (a single trained model) it is the cluster
    bootstrap of that unit's mean, variance ``W_1``. For unequal cluster sizes ``W_s`` is the
    linearised variance of the ratio mean, n/(n − 1)·Σ(t_i − m_s·k_i)²/(Σk_i)² (totals ``t_i``,
    sizes ``k_i``); the identities above then hold to first order.

    The interval is the ``confidence`` percentile interval of the resampled means; ``se`` their
    standard deviation. With few units the percentile interval is about a normal interval with a
    variance estimated on S − 1 degrees of freedom: for S = 3 a nominal 95 % interval covers about
    81 % when the run-to-run part dominates (P(|t₂| ≤ 1.96)); read it beside a Student-t interval
    over the unit means. A unit with one cluster contributes no within-unit resampling (W_s = 0).
    """
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype != object:
        raise CapscoreError("The 'values' parameter of hierarchical_bootstrap must be a sequence of arrays, "
                            "one per unit; got one flat array instead (wrap it in a list for one unit).")
    if len(values) == 0:
        raise CapscoreError("The 'values' parameter of hierarchical_bootstrap must hold at least one unit; got none.")
    if clusters is not None and len(clusters) != len(values):
        raise CapscoreError(f"The 'clusters' parameter of hierarchical_bootstrap must give one label array per "
                            f"unit; got {len(clusters)} for {len(values)} units.")
    if not 0 < confidence < 1:
        raise CapscoreError(f"The 'confidence' parameter of hierarchical_bootstrap must be in (0, 1); "
                            f"got {confidence!r} instead.")
    if n_resamples < 2:
        raise CapscoreError(f"The 'n_resamples' parameter of hierarchical_bootstrap must be at least 2; "
                            f"got {n_resamples!r} instead.")
    units = [_unit(v, None if clusters is None else clusters[k], k) for k, v in enumerate(values)]
    S = len(units)
    means = np.array([t.sum() / n.sum() for t, n in units])
    within = np.array([len(t) / (len(t) - 1) * np.sum((t - m * n) ** 2) / n.sum() ** 2 if len(t) > 1 else 0.0
                       for (t, n), m in zip(units, means)])
    grand = float(means.mean())
    B = float(means.var(ddof=1)) if S > 1 else float("nan")
    W = float(within.mean())
    c = 1.0
    if adjust and S > 1:
        c = float(np.sqrt(S / (S - 1) * max(0.0, 1.0 - W / B))) if B > 0 else 0.0
    rng = np.random.default_rng(seed)
    top = rng.integers(0, S, size=(n_resamples, S))  # the unit drawn into each slot
    draws = np.empty((n_resamples, S))
    for s, (t, n) in enumerate(units):
        rows = np.flatnonzero(top.ravel() == s)
        if rows.size == 0:
            continue
        k = len(t)
        r = np.sqrt(k / (k - 1)) if adjust and k > 1 else 1.0
        inner = np.empty(rows.size)
        step = max(1, 2_000_000 // k)  # bound the index array's memory
        for a in range(0, rows.size, step):
            idx = rng.integers(0, k, size=(min(step, rows.size - a), k))
            inner[a:a + step] = t[idx].sum(1) / n[idx].sum(1) - means[s]
        draws.ravel()[rows] = grand + c * (means[s] - grand) + r * inner
    boot = draws.mean(1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return HierarchicalCI(estimate=grand, low=float(lo), high=float(hi), se=float(boot.std(ddof=1)), units=S,
                          clusters=int(sum(len(t) for t, _ in units)), items=int(sum(n.sum() for _, n in units)),
                          between=B, within=W, shrink=c)
