"""hierarchical_bootstrap: a tiny case checked by hand, synthetic data whose right width is known
analytically (run effects + image effects + item noise), and the error rules."""
from __future__ import annotations

import math

import numpy as np
import pytest

from capscore.errors import CapscoreError
from capscore.meta.stats import hierarchical_bootstrap

TINY = [np.array([1.0, 3.0]), np.array([5.0, 7.0, 9.0])]


def test_tiny_case_by_hand():
    # unit means 2 and 7 -> estimate 4.5 (units weigh equally; the pooled item mean would be 5)
    # B = var([2, 7], ddof=1) = 12.5; W_1 = s²/n = 2/2 = 1, W_2 = 4/3 = 4/3; W = 7/6
    r = hierarchical_bootstrap(TINY, n_resamples=40_000, seed=1)
    assert r.estimate == 4.5 and (r.units, r.clusters, r.items) == (2, 5, 5)
    assert r.between == pytest.approx(12.5) and r.within == pytest.approx(7 / 6)
    assert r.shrink == pytest.approx(math.sqrt(2 * (1 - (7 / 6) / 12.5)))
    # adjusted: variance max(B, W) / S = 6.25 -> SE 2.5
    assert r.se == pytest.approx(2.5, rel=0.03)
    assert r.low < 4.5 < r.high
    # plain two-stage: (S-1)/S² B + (1/S) mean((n-1)/n W_s) = 12.5/4 + (1/2)(1/2 + (2/3)(4/3))/2
    plain = hierarchical_bootstrap(TINY, n_resamples=40_000, seed=1, adjust=False)
    assert plain.se == pytest.approx(math.sqrt(12.5 / 4 + 0.5 * (0.5 + 8 / 9) / 2), rel=0.03)


def test_one_unit_is_the_cluster_bootstrap():
    # one unit [1, 3]: a resample mean is 1, 2 or 3 with probabilities 1/4, 1/2, 1/4 (variance 1/2);
    # scaled by sqrt(n/(n-1)) = sqrt(2) the variance is s²/n = 1
    r = hierarchical_bootstrap([np.array([1.0, 3.0])], n_resamples=40_000, seed=2)
    assert r.estimate == 2.0 and math.isnan(r.between) and r.within == pytest.approx(1.0)
    assert r.se == pytest.approx(1.0, rel=0.03)
    assert r.low == pytest.approx(2 - math.sqrt(2)) and r.high == pytest.approx(2 + math.sqrt(2))
    assert hierarchical_bootstrap([np.array([1.0, 3.0])], n_resamples=40_000, seed=2,
                                  adjust=False).se == pytest.approx(math.sqrt(0.5), rel=0.03)


def test_items_of_one_cluster_move_together():
    # [1, 1, 3, 3] in clusters a, a, b, b is the unit [1, 3] of two clusters: the same resamples exactly
    grouped = hierarchical_bootstrap([np.array([1.0, 1.0, 3.0, 3.0]), TINY[1]],
                                     [["a", "a", "b", "b"], [0, 1, 2]], n_resamples=500, seed=3)
    plain = hierarchical_bootstrap(TINY, n_resamples=500, seed=3)
    assert (grouped.estimate, grouped.low, grouped.high, grouped.se) == (plain.estimate, plain.low, plain.high,
                                                                         plain.se)
    assert (grouped.clusters, grouped.items) == (5, 7)


def _synthetic(rng, S, n, m, sd_run, sd_image, sd_item):
    """S runs × n images × m items: y = run effect + image effect + item noise (mean 0)."""
    vals, labels = [], []
    for _ in range(S):
        a = rng.normal(0, sd_run)
        b = np.repeat(rng.normal(0, sd_image, n), m)
        vals.append(a + b + rng.normal(0, sd_item, n * m))
        labels.append(np.repeat(np.arange(n), m))
    return vals, labels


def test_width_matches_the_analytic_se_when_runs_dominate():
    # Var(grand mean) = σ²_run / S + (σ²_image + σ²_item/m) / (S n); three runs, as the replications have
    # (the plain two-stage scheme would give about 2/3 of it here: (S-1)/S² B + ...)
    S, n, m, sd_run, sd_image, sd_item = 3, 100, 3, 0.3, 0.5, 1.0
    truth = sd_run ** 2 / S + (sd_image ** 2 + sd_item ** 2 / m) / (S * n)
    rng = np.random.default_rng(11)
    var, est = [], []
    for rep in range(400):
        vals, labels = _synthetic(rng, S, n, m, sd_run, sd_image, sd_item)
        r = hierarchical_bootstrap(vals, labels, n_resamples=300, seed=rep)
        var.append(r.se ** 2)
        est.append(r.estimate)
    assert np.var(est) == pytest.approx(truth, rel=0.15)  # the simulation itself agrees with the formula
    assert np.mean(var) == pytest.approx(truth, rel=0.15)  # the bootstrap variance is right on average


def test_width_matches_the_analytic_se_of_one_run_and_ignoring_clusters_is_too_narrow():
    # one run: Var(mean) = (σ²_image + σ²_item/m) / n; items treated as independent would give
    # (σ²_image + σ²_item) / (n m), too small by the design effect
    n, m, sd_image, sd_item = 300, 4, 0.5, 1.0
    truth = (sd_image ** 2 + sd_item ** 2 / m) / n
    naive = (sd_image ** 2 + sd_item ** 2) / (n * m)
    rng = np.random.default_rng(12)
    hier, flat = [], []
    for rep in range(60):
        vals, labels = _synthetic(rng, 1, n, m, 0.0, sd_image, sd_item)
        hier.append(hierarchical_bootstrap(vals, labels, n_resamples=400, seed=rep).se ** 2)
        flat.append(hierarchical_bootstrap(vals, n_resamples=400, seed=rep).se ** 2)
    assert np.mean(hier) == pytest.approx(truth, rel=0.08)
    assert np.mean(flat) == pytest.approx(naive, rel=0.08)


@pytest.mark.parametrize("args, kwargs, words", [
    ((np.array([1.0, 2.0]),), {}, "sequence of arrays"),
    (([],), {}, "at least one unit"),
    (([np.array([])],), {}, "unit 0 has no items"),
    (([np.array([1.0, np.nan])],), {}, "values of unit 0 has a non-finite value"),
    ((TINY, [[0, 1]]), {}, "one label array per unit"),
    ((TINY, [[0, 1], [0, 1]]), {}, "unit 1: clusters and values differ"),
    ((TINY,), {"confidence": 95}, "'confidence'"),
    ((TINY,), {"n_resamples": 1}, "'n_resamples'"),
])
def test_errors_name_the_parameter(args, kwargs, words):
    with pytest.raises(CapscoreError, match=words):
        hierarchical_bootstrap(*args, **kwargs)
