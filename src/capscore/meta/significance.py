"""Significance tests for caption metrics, as machine-translation metrics research runs them — pure functions.

Two questions, two families of tests:

**Is system A better than system B under one metric?** (Koehn 2004, "Statistical significance
tests for machine translation evaluation"; Riezler & Maxwell 2005 for approximate randomisation.)

* :func:`paired_bootstrap` — resample the test set with replacement, recompute the difference of the
  two systems' mean scores on each resample. Reported: the observed difference δ = mean(a − b), its
  percentile interval, Koehn's "wins" (share of resamples where A's mean is above B's), and a two-sided
  p-value under the *shifted* null (Berg-Kirkpatrick et al. 2012, §2: the bootstrap distribution is
  centred on δ, so p = share of resamples with |δ* − δ| ≥ |δ|).
* :func:`approximate_randomization` — under the null hypothesis the labels "A" and "B" are
  exchangeable within each unit, so each unit's pair of scores is swapped with probability ½ and the
  difference recomputed. p = (1 + #{|δ*| ≥ |δ|}) / (1 + R) (Noreen 1989's add-one estimate, which
  Riezler & Maxwell 2005 use; two-sided).

Both resample **clusters**, not captions, when ``clusters`` is given: all captions of one image move
together (a cluster bootstrap / a cluster-wise swap), since captions of one image share its
difficulty and are not independent. Without ``clusters`` every item is its own cluster. The statistic
is the mean over *captions* of the resample (Σ of the drawn clusters' sums / Σ of their sizes), so
clusters of unequal size weigh as their captions do.

* :func:`compare_summed` — the same two tests of a **corpus statistic** (corpus BLEU, METEOR's
  aggregate: a function ``finish`` of the column sums of one vector per item, as
  :class:`capscore.scores.aggregate.Summed` defines it), recomputed on every resample from the drawn
  clusters' summed vectors, as machine-translation significance testing does for BLEU (Koehn 2004
  resamples the test set and recomputes corpus BLEU; Riezler & Maxwell 2005 swap the two systems'
  outputs of randomly chosen sentences and recompute it). The draws are those of :func:`paired_bootstrap` and
  :func:`approximate_randomization` for the same seed, so with the mean as the statistic the tests give
  theirs.

**Does metric M1 agree with humans better than metric M2 does, on the same judgments?**
(Graham & Baldwin 2014, "Testing for significance of increased correlation with human judgment",
EMNLP, §3; the WMT metrics tasks since 2014.)

* :func:`williams_test` — Williams (1959) test for the difference between two *dependent* Pearson
  correlations that share one variable (human h, metrics m1, m2): with r12 = r(h, m1), r13 = r(h, m2),
  r23 = r(m1, m2) and K = 1 − r12² − r13² − r23² + 2·r12·r13·r23,

      t = (r12 − r13) · sqrt((n − 1)(1 + r23)) / sqrt(2K (n − 1)/(n − 3) + ((r12 + r13)² / 4) (1 − r23)³)

  with n − 3 degrees of freedom (Graham & Baldwin 2014, eq. 1). The p-value is one-sided, for
  "m1 correlates more strongly than m2" (as Graham & Baldwin and WMT report it); p(m2 > m1) = 1 − p.
* :func:`tau_difference` — a paired bootstrap of τ(m1, h) − τ(m2, h) (Kendall τ-b or τ-c, as the table
  reports): items (or image clusters) are resampled, both τ recomputed on the same resample; a
  percentile interval and the same shifted-null two-sided p as :func:`paired_bootstrap`.
* :func:`compare_metrics` — every ordered pair of metrics: a matrix of Williams p-values (Pearson) and
  of τ-difference p-values, and WMT's ranking "cluster": the metrics whose τ is not significantly
  different (two-sided τ bootstrap, p ≥ ``alpha``) from the best metric's. (WMT draws clusters with the
  significance test it reports; capscore draws them with the τ test because τ is the statistic of the
  caption-metric tables; the Williams matrix is reported beside it.)

Everything is seeded (``numpy.random.default_rng(seed)``) and every result carries the number of
resamples and the seed.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats as st

from capscore.errors import CapscoreError, param_error
from capscore.meta import MAX_RESAMPLES
from capscore.meta.stats import _vector, unit_scale
from capscore.report.tables import format_p, format_table

TAU_KINDS = ("tau_b", "tau_c")


# ------------------------------------------------------------------------------------ validation
def _scores(x, what: str) -> np.ndarray:
    return _vector(x, what)


BLOCK = 1 << 22  # random numbers drawn at once: the draws of many resamples are made block by block


def _check_resamples(n_resamples: int, func: str) -> None:
    if (not isinstance(n_resamples, (int, np.integer)) or isinstance(n_resamples, bool)
            or not 1 <= n_resamples <= MAX_RESAMPLES):
        raise param_error("n_resamples", func, f"an int in [1, {MAX_RESAMPLES:,}]", n_resamples)


def _blocks(n_resamples: int, width: int):
    """(start, stop) of consecutive blocks of resamples, each drawing at most about BLOCK numbers."""
    step = max(1, BLOCK // max(1, width))
    return ((a, min(a + step, n_resamples)) for a in range(0, n_resamples, step))


def _overflow(*values: float) -> None:
    """Refuse a result that float64 could not hold (scores near ±1e308: their differences overflow)."""
    if not all(math.isfinite(v) for v in values):
        raise CapscoreError("the scores are too large to compare: their means or differences overflow 64-bit "
                            "floats (scores near ±1e308); rescale them")


def cluster_index(clusters: Sequence | None, n: int) -> np.ndarray:
    """Cluster labels -> integer codes 0..G-1 (first appearance order); ``None`` = each item its own."""
    if clusters is None:
        return np.arange(n)
    if len(clusters) != n:
        raise CapscoreError(f"clusters and scores differ in length: {len(clusters)} vs {n}")
    codes: dict = {}
    return np.asarray([codes.setdefault(c, len(codes)) for c in clusters], dtype=np.int64)


def _cluster_draws(rng: np.random.Generator, n_clusters: int, n_resamples: int) -> np.ndarray:
    """(R, G) cluster indices drawn with replacement: row k is resample k (G draws each). Drawn block by
    block (:func:`_blocks`), row k is the same whatever the block size."""
    return rng.integers(0, n_clusters, size=(n_resamples, n_clusters))


# ------------------------------------------------------------------------------------ two systems
@dataclass(frozen=True)
class SystemTest:
    """One test between two systems scored by one metric."""

    test: str  # "paired_bootstrap" or "approximate_randomization"
    mean_a: float
    mean_b: float
    delta: float  # mean(a) - mean(b), over captions
    p_value: float  # two-sided
    n_items: int
    n_clusters: int
    n_resamples: int
    seed: int
    ci: tuple[float, float] | None = None  # bootstrap only: percentile interval of delta
    wins_a: float | None = None  # bootstrap only: share of resamples with mean(a) > mean(b) (Koehn 2004)
    confidence: float | None = None
    statistic: str = "mean"  # what mean_a, mean_b and delta are: the mean, or a corpus score (corpus-bleu4)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci else None
        return d


def _two_systems(a, b, clusters):
    x, y = _scores(a, "scores of system A"), _scores(b, "scores of system B")
    if x.shape != y.shape:
        raise CapscoreError(f"scores of system A and system B differ in length: {x.size} vs {y.size}")
    if x.size < 2:
        raise CapscoreError(f"a system comparison needs at least 2 paired items; got {x.size}")
    codes = cluster_index(clusters, x.size)
    g = int(codes.max()) + 1
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.bincount(codes, weights=x - y, minlength=g)  # per-cluster Σ(a − b)
        _overflow(float(x.mean()), float(y.mean()), float(np.abs(sums).sum()))
    sizes = np.bincount(codes, minlength=g).astype(float)
    if g < 2:
        raise CapscoreError("a system comparison needs at least 2 clusters (images); got 1")
    return x, y, sums, sizes


def paired_bootstrap(a, b, *, clusters: Sequence | None = None, n_resamples: int = 1000, seed: int = 0,
                     confidence: float = 0.95) -> SystemTest:
    """Paired (cluster) bootstrap of mean(a) − mean(b) (Koehn 2004; see the module docstring).

    ``a``, ``b``: the two systems' scores of the same items, in the same order; ``clusters``: one label
    per item (the image), or ``None``.
    """
    _check_resamples(n_resamples, "paired_bootstrap")
    if not 0 < confidence < 1:
        raise param_error("confidence", "paired_bootstrap", "a number in (0, 1)", confidence)
    x, y, sums, sizes = _two_systems(a, b, clusters)
    delta = float(sums.sum() / sizes.sum())
    rng = np.random.default_rng(seed)
    boot = np.empty(n_resamples)
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in _blocks(n_resamples, sums.size):
            draws = _cluster_draws(rng, sums.size, hi - lo)
            boot[lo:hi] = sums[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    _overflow(float(np.abs(boot).max()))
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    p = float(np.mean(np.abs(boot - delta) >= abs(delta))) if delta != 0 else 1.0
    return SystemTest("paired_bootstrap", float(x.mean()), float(y.mean()), delta, p, int(x.size), int(sums.size),
                      int(n_resamples), int(seed), (float(lo), float(hi)), float(np.mean(boot > 0)), confidence)


def approximate_randomization(a, b, *, clusters: Sequence | None = None, n_resamples: int = 10000,
                              seed: int = 0) -> SystemTest:
    """Paired approximate randomisation of mean(a) − mean(b) (Riezler & Maxwell 2005): each cluster's
    labels are swapped with probability ½; two-sided add-one p-value (see the module docstring)."""
    _check_resamples(n_resamples, "approximate_randomization")
    x, y, sums, sizes = _two_systems(a, b, clusters)
    total = sizes.sum()
    delta = float(sums.sum() / total)
    rng = np.random.default_rng(seed)
    perm = np.empty(n_resamples)
    with np.errstate(over="ignore", invalid="ignore"):
        for lo, hi in _blocks(n_resamples, sums.size):
            signs = rng.integers(0, 2, size=(hi - lo, sums.size)) * 2 - 1  # (block, G) ±1
            perm[lo:hi] = (signs * sums).sum(axis=1) / total
    _overflow(float(np.abs(perm).max()))
    # a tolerance so that a permutation equal to the observed one (up to float summation order) counts
    hits = int(np.sum(np.abs(perm) >= abs(delta) - 1e-12 * max(1.0, abs(delta))))
    p = (hits + 1) / (n_resamples + 1)
    return SystemTest("approximate_randomization", float(x.mean()), float(y.mean()), delta, float(p), int(x.size),
                      int(sums.size), int(n_resamples), int(seed))


def compare_systems(a, b, *, clusters: Sequence | None = None, n_resamples: int = 1000, seed: int = 0,
                    confidence: float = 0.95) -> tuple[SystemTest, SystemTest]:
    """Both system tests with the same resample count and seed."""
    return (paired_bootstrap(a, b, clusters=clusters, n_resamples=n_resamples, seed=seed, confidence=confidence),
            approximate_randomization(a, b, clusters=clusters, n_resamples=n_resamples, seed=seed))


def _summed_inputs(a, b, clusters) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-cluster sums of the two systems' per-item vectors ((G, K) each) and the number of items."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 2 or x.shape != y.shape:
        raise CapscoreError(f"the per-item vectors of system A and system B must be two (items, K) arrays of one "
                            f"shape; got {x.shape} and {y.shape}")
    if len(x) < 2:
        raise CapscoreError(f"a system comparison needs at least 2 paired items; got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise CapscoreError("the per-item vectors of a system comparison must be finite")
    codes = cluster_index(clusters, len(x))
    g = int(codes.max()) + 1
    if g < 2:
        raise CapscoreError("a system comparison needs at least 2 clusters (images); got 1")
    sa, sb = np.zeros((g, x.shape[1])), np.zeros((g, x.shape[1]))
    np.add.at(sa, codes, x)
    np.add.at(sb, codes, y)
    return sa, sb, len(x)


def compare_summed(a, b, finish, *, clusters: Sequence | None = None, n_resamples: int = 1000, seed: int = 0,
                   confidence: float = 0.95, statistic: str = "corpus") -> tuple[SystemTest, SystemTest]:
    """The paired bootstrap and approximate randomisation of ``finish(Σ a) − finish(Σ b)`` (module docstring).

    ``a``, ``b``: the two systems' per-item vectors ((items, K), the same items in the same order);
    ``finish``: (..., K) sums -> (...) statistic values (e.g. ``CorpusBleu(4).finish``); ``statistic``: its
    name, recorded in the results. The bootstrap draws image clusters with replacement and recomputes both
    systems' statistic on the same draw; the randomisation swaps each cluster's two systems with probability
    ½ and recomputes both pseudo-systems' statistic. p-values and interval as :func:`paired_bootstrap` and
    :func:`approximate_randomization`.
    """
    _check_resamples(n_resamples, "compare_summed")
    if not 0 < confidence < 1:
        raise param_error("confidence", "compare_summed", "a number in (0, 1)", confidence)
    sa, sb, n = _summed_inputs(a, b, clusters)
    g = len(sa)
    value_a, value_b = float(finish(sa.sum(0))), float(finish(sb.sum(0)))
    delta = value_a - value_b
    rng = np.random.default_rng(seed)
    boot = np.empty(n_resamples)
    for lo, hi in _blocks(n_resamples, g):
        draws = _cluster_draws(rng, g, hi - lo)  # (B, G): the clusters of each resample
        counts = np.bincount((np.arange(hi - lo)[:, None] * g + draws).ravel(),
                             minlength=(hi - lo) * g).reshape(hi - lo, g).astype(float)
        boot[lo:hi] = finish(counts @ sa) - finish(counts @ sb)
    tail = (1 - confidence) / 2
    q_lo, q_hi = np.quantile(boot, [tail, 1 - tail])
    p = float(np.mean(np.abs(boot - delta) >= abs(delta))) if delta != 0 else 1.0
    bootstrap = SystemTest("paired_bootstrap", value_a, value_b, delta, p, n, g, int(n_resamples), int(seed),
                           (float(q_lo), float(q_hi)), float(np.mean(boot > 0)), confidence, statistic)
    rng = np.random.default_rng(seed)
    total_a, total_b, diff = sa.sum(0), sb.sum(0), sb - sa
    perm = np.empty(n_resamples)
    for lo, hi in _blocks(n_resamples, g):
        swapped = 1.0 - rng.integers(0, 2, size=(hi - lo, g))  # approximate_randomization's draws: 0 = swapped
        moved = swapped @ diff
        perm[lo:hi] = finish(total_a + moved) - finish(total_b - moved)
    hits = int(np.sum(np.abs(perm) >= abs(delta) - 1e-12 * max(1.0, abs(delta))))
    randomization = SystemTest("approximate_randomization", value_a, value_b, delta, (hits + 1) / (n_resamples + 1),
                               n, g, int(n_resamples), int(seed), statistic=statistic)
    return bootstrap, randomization


# ------------------------------------------------------------------------------------ two metrics
@dataclass(frozen=True)
class WilliamsResult:
    r12: float  # r(human, metric 1)
    r13: float  # r(human, metric 2)
    r23: float  # r(metric 1, metric 2)
    t: float
    df: int
    p_value: float  # one-sided: metric 1 correlates more strongly than metric 2


def williams_from_r(r12: float, r13: float, r23: float, n: int) -> WilliamsResult:
    """The Williams (1959) t statistic and one-sided p from the three correlations (Graham & Baldwin 2014, eq. 1)."""
    if not isinstance(n, (int, np.integer)) or n < 4:
        raise param_error("n", "williams_from_r", "an int >= 4 (the test has n - 3 degrees of freedom)", n)
    for name, r in (("r12", r12), ("r13", r13), ("r23", r23)):
        if not (math.isfinite(r) and -1 <= r <= 1):
            raise param_error(name, "williams_from_r", "a correlation in [-1, 1]", r)
    k = 1 - r12 ** 2 - r13 ** 2 - r23 ** 2 + 2 * r12 * r13 * r23
    den = 2 * k * (n - 1) / (n - 3) + ((r12 + r13) ** 2 / 4) * (1 - r23) ** 3
    num = (r12 - r13) * math.sqrt((n - 1) * (1 + r23))
    if den <= 0:  # the two metrics are perfectly correlated with each other (r23 = 1): no difference to test
        t = 0.0 if num == 0 else math.copysign(math.inf, num)
    else:
        t = num / math.sqrt(den)
    return WilliamsResult(r12, r13, r23, float(t), int(n - 3), float(st.t.sf(t, n - 3)))


def williams_test(metric1, metric2, human) -> WilliamsResult:
    """Williams test that ``metric1`` correlates (Pearson) more strongly with ``human`` than ``metric2``."""
    m1, m2, h = _scores(metric1, "metric 1 scores"), _scores(metric2, "metric 2 scores"), _scores(human, "human scores")
    if not (m1.size == m2.size == h.size):
        raise CapscoreError(f"metric 1, metric 2 and human scores differ in length: {m1.size}, {m2.size}, {h.size}")
    for a, what in ((m1, "metric 1 scores"), (m2, "metric 2 scores"), (h, "human scores")):
        if a.size and np.ptp(a) == 0:
            raise CapscoreError(f"{what} are constant: a correlation is undefined")

    r = lambda u, v: float(np.corrcoef(unit_scale(u), unit_scale(v))[0, 1])  # noqa: E731
    return williams_from_r(r(h, m1), r(h, m2), r(m1, m2), int(h.size))


def _tau(x: np.ndarray, y: np.ndarray, variant: str) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return 100 * float(st.kendalltau(x, y, variant=variant).statistic)


@dataclass(frozen=True)
class TauDifference:
    kind: str
    tau1: float  # ×100
    tau2: float
    delta: float  # tau1 - tau2
    ci: tuple[float, float] | None
    p_value: float  # two-sided (shifted null)
    n_items: int
    n_clusters: int
    n_resamples: int
    seed: int
    undefined: int = 0  # resamples on which a τ was undefined (constant), left out


def tau_difference(metric1, metric2, human, *, kind: str = "tau_c", clusters: Sequence | None = None,
                   n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> TauDifference:
    """Paired (cluster) bootstrap of τ(metric1, human) − τ(metric2, human), ×100 (module docstring)."""
    if kind not in TAU_KINDS:
        raise param_error("kind", "tau_difference", "'tau_b' or 'tau_c'", kind)
    _check_resamples(n_resamples, "tau_difference")
    m1, m2, h = _scores(metric1, "metric 1 scores"), _scores(metric2, "metric 2 scores"), _scores(human, "human scores")
    if not (m1.size == m2.size == h.size):
        raise CapscoreError(f"metric 1, metric 2 and human scores differ in length: {m1.size}, {m2.size}, {h.size}")
    if h.size < 2:
        raise CapscoreError(f"a τ comparison needs at least 2 items; got {h.size}")
    v = kind[-1]
    t1, t2 = _tau(m1, h, v), _tau(m2, h, v)
    if not (math.isfinite(t1) and math.isfinite(t2)):
        raise CapscoreError("τ is undefined on these scores (a constant metric or human score)")
    delta = t1 - t2
    codes = cluster_index(clusters, h.size)
    members = [np.flatnonzero(codes == g) for g in range(int(codes.max()) + 1)]
    draws = _cluster_draws(np.random.default_rng(seed), len(members), n_resamples)
    boot = np.empty(n_resamples)
    for k, row in enumerate(draws):
        idx = np.concatenate([members[g] for g in row])
        boot[k] = _tau(m1[idx], h[idx], v) - _tau(m2[idx], h[idx], v)
    ok = boot[np.isfinite(boot)]
    undefined = int(boot.size - ok.size)
    if ok.size == 0:
        return TauDifference(kind, t1, t2, delta, None, 1.0, int(h.size), len(members), int(n_resamples), int(seed),
                             undefined)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(ok, [tail, 1 - tail])
    p = float(np.mean(np.abs(ok - delta) >= abs(delta))) if delta != 0 else 1.0
    return TauDifference(kind, t1, t2, delta, (float(lo), float(hi)), p, int(h.size), len(members),
                         int(n_resamples), int(seed), undefined)


@dataclass(frozen=True)
class MetricComparison:
    """All pairs of metrics against one set of human judgments (see :func:`compare_metrics`)."""

    names: tuple[str, ...]
    kind: str  # the τ compared
    taus: tuple[float, ...]  # ×100, in ``names`` order
    williams_p: tuple[tuple[float | None, ...], ...]  # [i][j]: one-sided p that names[i] > names[j] (Pearson)
    tau_p: tuple[tuple[float | None, ...], ...]  # [i][j]: two-sided bootstrap p of τ_i − τ_j
    best: str
    cluster: tuple[str, ...]  # not significantly different from the best (tau_p >= alpha), best first
    alpha: float
    n_items: int
    n_clusters: int
    n_resamples: int
    seed: int
    params: Mapping[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["williams_p"] = [list(r) for r in self.williams_p]
        d["tau_p"] = [list(r) for r in self.tau_p]
        d["params"] = dict(self.params)
        return d


def best_cluster(names: Sequence[str], values: Sequence[float], p_vs: Mapping[tuple[str, str], float], *,
                 alpha: float = 0.05) -> tuple[str, tuple[str, ...]]:
    """WMT-style top cluster: the best (highest value) and every metric whose difference from it is not
    significant (``p_vs[(best, other)] >= alpha``); the cluster is ordered by value, best first."""
    if not names or len(names) != len(values):
        raise CapscoreError("best_cluster needs one value per name (and at least one name)")
    order = sorted(range(len(names)), key=lambda i: (-values[i], i))
    best = names[order[0]]
    members = [names[i] for i in order if names[i] == best or p_vs[(best, names[i])] >= alpha]
    return best, tuple(members)


def compare_metrics(scores: Mapping[str, Sequence[float]], human, *, kind: str = "tau_c",
                    clusters: Sequence | None = None, n_resamples: int = 1000, seed: int = 0,
                    alpha: float = 0.05) -> MetricComparison:
    """Every pair of metrics (same items, same order as ``human``): Williams p-values (Pearson), τ-difference
    bootstrap p-values, and the cluster of metrics not significantly different from the best τ."""
    names = list(scores)
    if len(names) < 2:
        raise CapscoreError(f"comparing metrics needs at least 2; got {len(names)}")
    if not 0 < alpha < 1:
        raise param_error("alpha", "compare_metrics", "a number in (0, 1)", alpha)
    h = _scores(human, "human scores")
    arrays = {n: _scores(scores[n], f"scores of {n}") for n in names}
    for n, a in arrays.items():
        if a.size != h.size:
            raise CapscoreError(f"scores of {n} and human scores differ in length: {a.size} vs {h.size}")
    k = len(names)
    will = [[None] * k for _ in range(k)]
    taup = [[None] * k for _ in range(k)]
    p_vs: dict[tuple[str, str], float] = {}
    for i in range(k):
        for j in range(k):
            if i == j:
                continue
            try:
                will[i][j] = williams_test(arrays[names[i]], arrays[names[j]], h).p_value
            except CapscoreError:
                will[i][j] = None
            if j > i:
                d = tau_difference(arrays[names[i]], arrays[names[j]], h, kind=kind, clusters=clusters,
                                   n_resamples=n_resamples, seed=seed)
                taup[i][j] = taup[j][i] = d.p_value
                p_vs[(names[i], names[j])] = p_vs[(names[j], names[i])] = d.p_value
    taus = [_tau(arrays[n], h, kind[-1]) for n in names]
    best, cluster = best_cluster(names, taus, p_vs, alpha=alpha)
    codes = cluster_index(clusters, h.size)
    return MetricComparison(tuple(names), kind, tuple(taus), tuple(map(tuple, will)), tuple(map(tuple, taup)),
                            best, cluster, alpha, int(h.size), int(codes.max()) + 1, int(n_resamples), int(seed),
                            {"williams": "one-sided, Pearson (Graham & Baldwin 2014)",
                             "tau_p": "two-sided paired bootstrap, shifted null"
                                      + (", image clusters" if clusters is not None else "")})


def format_comparison(c: MetricComparison) -> str:
    """The two p-value matrices and the cluster, as text."""
    def matrix(title: str, m, resamples: int | None = None) -> str:
        rows = []
        for i, n in enumerate(c.names):
            row = {"metric": n}
            for j, o in enumerate(c.names):
                row[o] = "-" if i == j else format_p(m[i][j], resamples)
            rows.append(row)
        return f"{title}\n" + format_table(rows, indent="")

    where = f"{c.n_clusters} image clusters" if c.n_clusters != c.n_items else f"{c.n_items} items"
    lines = [matrix("Williams test p-values (Pearson; row metric > column metric, one-sided):", c.williams_p),
             matrix(f"paired bootstrap p-values of the {c.kind} difference (two-sided; {c.n_resamples} resamples "
                    f"over {where}, seed {c.seed}):", c.tau_p, c.n_resamples),
             f"cluster (not significantly different from the best {c.kind}, p >= {c.alpha:g}): "
             + ", ".join(c.cluster)]
    return "\n".join(lines)


__all__ = [
    "MetricComparison", "SystemTest", "TauDifference", "WilliamsResult", "approximate_randomization",
    "best_cluster", "cluster_index", "compare_metrics", "compare_summed", "compare_systems", "format_comparison",
    "paired_bootstrap",
    "tau_difference", "williams_from_r", "williams_test",
]
