"""Significance tests against independent computations: exact enumeration, scipy, the formula by hand."""
import itertools
import math

import numpy as np
import pytest
from scipy import stats as st

from capscore.errors import CapscoreError
from capscore.meta import significance as sig


def _data(n_clusters=8, per=3, seed=1):
    rng = np.random.default_rng(seed)
    clusters = np.repeat([f"img{g}" for g in range(n_clusters)], per)
    a = rng.normal(0.6, 0.2, clusters.size)
    b = a - 0.05 + rng.normal(0, 0.15, clusters.size)
    return a, b, clusters


# ------------------------------------------------------------------------------------ approximate randomisation
def test_randomization_matches_scipy_exact_permutation_test_without_clusters():
    rng = np.random.default_rng(3)
    a = rng.normal(0.5, 0.2, 11)
    b = a - 0.08 + rng.normal(0, 0.1, 11)
    exact = st.permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                                n_resamples=np.inf, alternative="two-sided").pvalue  # 2**11 sign flips
    got = sig.approximate_randomization(a, b, n_resamples=40000, seed=0)
    assert got.n_resamples == 40000 and got.seed == 0 and got.n_clusters == 11
    assert got.delta == pytest.approx(np.mean(a - b))
    assert got.p_value == pytest.approx(exact, abs=0.01)  # Monte Carlo error of 40000 draws: < 0.0025


def test_clustered_randomization_matches_exact_enumeration_of_cluster_swaps():
    a, b, clusters = _data(n_clusters=9, per=3)
    d = a - b
    groups = [np.flatnonzero(clusters == c) for c in dict.fromkeys(clusters)]
    observed = abs(d.mean())
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(groups)):  # every swap of whole images
        total = sum(s * d[g].sum() for s, g in zip(signs, groups))
        hits += abs(total / d.size) >= observed - 1e-12
    exact = hits / 2 ** len(groups)
    got = sig.approximate_randomization(a, b, clusters=clusters, n_resamples=40000, seed=5)
    assert got.n_clusters == 9 and got.n_items == 27
    assert got.p_value == pytest.approx(exact, abs=0.012)
    # treating the 27 captions as independent gives a different (smaller) p here
    loose = sig.approximate_randomization(a, b, n_resamples=40000, seed=5)
    assert loose.p_value < got.p_value


# ------------------------------------------------------------------------------------ paired bootstrap
def _bootstrap_by_hand(a, b, clusters, R, seed, conf=0.95):
    rng = np.random.default_rng(seed)
    labels = list(dict.fromkeys(clusters))
    groups = [np.flatnonzero(np.asarray(clusters) == c) for c in labels]
    delta = np.mean(a - b)
    boot = []
    for _ in range(R):
        pick = rng.integers(0, len(groups), size=len(groups))
        idx = np.concatenate([groups[g] for g in pick])
        boot.append(np.mean(a[idx]) - np.mean(b[idx]))
    boot = np.asarray(boot)
    lo, hi = np.quantile(boot, [(1 - conf) / 2, 1 - (1 - conf) / 2])
    p = np.mean(np.abs(boot - delta) >= abs(delta))
    return delta, (lo, hi), p, np.mean(boot > 0)


def test_cluster_bootstrap_equals_a_loop_written_out():
    a, b, clusters = _data()
    delta, ci, p, wins = _bootstrap_by_hand(a, b, clusters, 500, 7)
    got = sig.paired_bootstrap(a, b, clusters=clusters, n_resamples=500, seed=7)
    assert got.delta == pytest.approx(delta)
    assert got.ci == pytest.approx(ci)
    assert got.p_value == pytest.approx(p)
    assert got.wins_a == pytest.approx(wins)
    assert (got.n_resamples, got.seed, got.n_clusters) == (500, 7, 8)


def test_bootstrap_interval_agrees_with_scipy_bootstrap_without_clusters():
    rng = np.random.default_rng(4)
    a = rng.normal(0.5, 0.2, 200)
    b = a - 0.03 + rng.normal(0, 0.1, 200)
    ref = st.bootstrap((a - b,), np.mean, n_resamples=20000, method="percentile",
                       rng=np.random.default_rng(1)).confidence_interval
    got = sig.paired_bootstrap(a, b, n_resamples=20000, seed=2)
    assert got.ci[0] == pytest.approx(ref.low, abs=0.002)
    assert got.ci[1] == pytest.approx(ref.high, abs=0.002)
    # a clear difference: A wins nearly every resample and both tests call it significant
    ar = sig.approximate_randomization(a, b, n_resamples=5000, seed=2)
    assert got.wins_a > 0.99 and got.p_value < 0.01 and ar.p_value < 0.01


def test_identical_systems_are_not_different():
    a, _, clusters = _data()
    boot, ar = sig.compare_systems(a, a.copy(), clusters=clusters, n_resamples=200, seed=0)
    assert boot.delta == 0 and boot.p_value == 1.0 and ar.p_value == 1.0


def test_system_errors_name_the_problem():
    with pytest.raises(CapscoreError, match="differ in length"):
        sig.paired_bootstrap([1, 2, 3], [1, 2])
    with pytest.raises(CapscoreError, match="n_resamples"):
        sig.approximate_randomization([1, 2, 3], [1, 2, 2], n_resamples=0)
    with pytest.raises(CapscoreError, match="clusters and scores differ"):
        sig.paired_bootstrap([1, 2, 3], [1, 2, 2], clusters=["x"])
    with pytest.raises(CapscoreError, match="non-finite"):
        sig.paired_bootstrap([1, float("nan")], [1, 2])


# ------------------------------------------------------------------------------------ Williams
def test_williams_statistic_by_hand():
    # Graham & Baldwin 2014, eq. 1, written out for r12 = .6, r13 = .4, r23 = .5, n = 50
    r12, r13, r23, n = 0.6, 0.4, 0.5, 50
    K = 1 - r12 ** 2 - r13 ** 2 - r23 ** 2 + 2 * r12 * r13 * r23  # = 1 - .36 - .16 - .25 + .24 = 0.47
    assert K == pytest.approx(0.47)
    t = (r12 - r13) * math.sqrt((n - 1) * 1.5) / math.sqrt(2 * K * 49 / 47 + (1.0 ** 2 / 4) * 0.5 ** 3)
    assert t == pytest.approx(1.7051, abs=1e-4)  # 0.2 * sqrt(73.5) / sqrt(0.98 + 0.03125) = 1.714643 / 1.005609
    got = sig.williams_from_r(r12, r13, r23, n)
    assert got.t == pytest.approx(t) and got.df == 47
    assert got.p_value == pytest.approx(st.t.sf(t, 47))
    assert 0.04 < got.p_value < 0.05  # one-sided, just significant at 0.05


def test_williams_from_scores_uses_the_three_pearson_correlations():
    rng = np.random.default_rng(0)
    h = rng.normal(size=40)
    m1 = h + rng.normal(0, 0.8, 40)
    m2 = h + rng.normal(0, 1.5, 40)
    r12, r13, r23 = st.pearsonr(h, m1)[0], st.pearsonr(h, m2)[0], st.pearsonr(m1, m2)[0]
    got = sig.williams_test(m1, m2, h)
    assert (got.r12, got.r13, got.r23) == pytest.approx((r12, r13, r23))
    rev = sig.williams_test(m2, m1, h)
    assert rev.t == pytest.approx(-got.t) and rev.p_value == pytest.approx(1 - got.p_value)


# ------------------------------------------------------------------------------------ τ difference and cluster
def test_tau_difference_equals_a_loop_written_out():
    rng = np.random.default_rng(2)
    clusters = np.repeat(np.arange(10), 4)
    h = rng.integers(1, 5, 40).astype(float)
    m1 = h + rng.normal(0, 1.0, 40)
    m2 = h + rng.normal(0, 2.5, 40)
    R, seed = 300, 11
    groups = [np.flatnonzero(clusters == g) for g in range(10)]
    gen = np.random.default_rng(seed)
    boot = []
    for _ in range(R):
        idx = np.concatenate([groups[g] for g in gen.integers(0, 10, size=10)])
        boot.append(100 * (st.kendalltau(m1[idx], h[idx], variant="c")[0] - st.kendalltau(m2[idx], h[idx], variant="c")[0]))
    boot = np.asarray(boot)
    delta = 100 * (st.kendalltau(m1, h, variant="c")[0] - st.kendalltau(m2, h, variant="c")[0])
    got = sig.tau_difference(m1, m2, h, kind="tau_c", clusters=clusters, n_resamples=R, seed=seed)
    assert got.delta == pytest.approx(delta)
    assert got.p_value == pytest.approx(np.mean(np.abs(boot - delta) >= abs(delta)))
    assert got.ci == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))


def test_best_cluster_by_hand():
    p = {("a", "b"): 0.30, ("b", "a"): 0.30, ("a", "c"): 0.01, ("c", "a"): 0.01, ("b", "c"): 0.2, ("c", "b"): 0.2}
    assert sig.best_cluster(["c", "a", "b"], [10.0, 50.0, 45.0], p) == ("a", ("a", "b"))


def test_compare_metrics_matrix_and_cluster():
    rng = np.random.default_rng(0)
    h = rng.normal(size=120)
    scores = {"good": h + rng.normal(0, 0.3, 120), "good2": h + rng.normal(0, 0.32, 120),
              "bad": h + rng.normal(0, 3.0, 120)}
    c = sig.compare_metrics(scores, h, kind="tau_b", n_resamples=300, seed=0)
    assert c.best in ("good", "good2") and set(c.cluster) == {"good", "good2"}
    i, j = c.names.index("good"), c.names.index("bad")
    assert c.williams_p[i][j] == pytest.approx(sig.williams_test(scores["good"], scores["bad"], h).p_value)
    assert c.williams_p[i][j] < 0.001 and c.tau_p[i][j] < 0.01 and c.tau_p[i][j] == c.tau_p[j][i]
    assert c.taus[i] == pytest.approx(100 * st.kendalltau(scores["good"], h, variant="b")[0])
    text = sig.format_comparison(c)
    assert "Williams" in text and "300 resamples" in text and "cluster" in text


# ------------------------------------------------------------------------------------ capscore compare
def _write(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_compare_command_pairs_by_id_and_clusters_by_image(tmp_path, capsys):
    import json

    from capscore.cli import main

    a, b, clusters = _data(n_clusters=6, per=2)
    ra = [{"id": f"c{i}", "image": str(g), "caption": "x", "score": float(s)} for i, (g, s) in enumerate(zip(clusters, a))]
    rb = [{"id": f"c{i}", "image": str(g), "caption": "y", "score": float(s)} for i, (g, s) in enumerate(zip(clusters, b))]
    ra.append({"id": "extra", "image": "z", "caption": "x", "score": None})  # an error row: counted, left out
    fa, fb = _write(tmp_path / "a.jsonl", ra), _write(tmp_path / "b.jsonl", rb[::-1])  # order does not matter
    assert main(["compare", str(fa), str(fb), "--resamples", "400", "--seed", "3", "--out",
                 str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "12 captions of 6 images" in out and "1 no score in A" in out
    got = json.loads((tmp_path / "c.json").read_text())
    boot = sig.paired_bootstrap(a, b, clusters=clusters, n_resamples=400, seed=3)
    ar = sig.approximate_randomization(a, b, clusters=clusters, n_resamples=400, seed=3)
    assert got["tests"][0]["p_value"] == pytest.approx(boot.p_value)
    assert got["tests"][1]["p_value"] == pytest.approx(ar.p_value)
    assert got["tests"][0]["n_resamples"] == 400 and got["tests"][0]["n_clusters"] == 6


def test_compare_command_errors_are_one_line(tmp_path, capsys):
    from capscore.cli import main

    fa = _write(tmp_path / "a.jsonl", [{"id": "1", "image": "i", "score": 0.5}, {"id": "2", "image": "j", "score": 0.4}])
    fb = _write(tmp_path / "b.jsonl", [{"id": "1", "image": "k", "score": 0.5}, {"id": "2", "image": "j", "score": 0.1}])
    assert main(["compare", str(fa), str(fb)]) == 2
    assert "b.jsonl: id '1': the same id names another image" in capsys.readouterr().err
    fc = _write(tmp_path / "c.jsonl", [{"id": "9", "image": "i", "score": 0.5}])
    assert main(["compare", str(fa), str(fc)]) == 2
    assert "share 0 scored id(s)" in capsys.readouterr().err
    fd = _write(tmp_path / "d.jsonl", [{"id": "9", "score": 0.5}])
    assert main(["compare", str(fa), str(fd)]) == 2
    assert "d.jsonl:1: missing column 'image'" in capsys.readouterr().err
