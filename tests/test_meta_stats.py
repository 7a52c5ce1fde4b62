"""Statistics: hand-computed small cases (ties included), scipy on random data, and the error rules."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from capscore.errors import CapscoreError
from capscore.meta import stats as S


def test_kendall_by_hand_without_ties():
    # x=[1,2,3,4], y=[1,3,2,4]: 5 concordant, 1 discordant pair of 6 -> tau = 4/6
    assert S.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4], variant="b") == pytest.approx(100 * 4 / 6)
    # tau-c = 2(C-D) / (n^2 (m-1)/m), m = 4 -> 8 / 12
    assert S.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4], variant="c") == pytest.approx(100 * 8 / 12)


def test_kendall_by_hand_with_ties():
    # x=[1,1,2,3], y=[1,2,2,3]: C=4, D=0, one pair tied in x only, one tied in y only.
    x, y = [1, 1, 2, 3], [1, 2, 2, 3]
    assert S.kendall_tau(x, y, variant="b") == pytest.approx(100 * 4 / math.sqrt(5 * 5))  # 80
    # tau-c: m = min(3 distinct x, 3 distinct y) = 3 -> 2*4 / (16 * 2/3) = 0.75
    assert S.kendall_tau(x, y, variant="c") == pytest.approx(75.0)


def test_pearson_and_fitted_one_minus_r2_by_hand():
    # x=[1,2,3], y=[1,2,4]: cov-sum 3, Sxx 2, Syy 42/9 -> r = 3/sqrt(84/9), r^2 = 81/84
    r = 3 / math.sqrt(2 * 42 / 9)
    assert S.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(100 * r)
    assert S.one_minus_r2_fit([1, 2, 3], [1, 2, 4]) == pytest.approx(100 * (1 - 81 / 84))


def test_specs_table2_one_minus_r2_is_unfitted_by_hand():
    # metric m = [1, 2, 3] as predictions of human h = [1, 2, 4]: residuals 0, 0, 1 -> SS_res = 1;
    # h-bar = 7/3, SS_tot = (16 + 1 + 25)/9 = 42/9 -> 1 - R^2 = 1 / (42/9) = 9/42, x1 (not x100)
    assert S.one_minus_r2([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / 42)
    # a metric on another scale than the humans: m = 10*h-ish -> far worse than predicting the mean (> 1),
    # the way Table 2 reaches 156.05 (ROUGE) and 3.30E+07 (CIDEr). h = [1, 2, 3], m = [10, 20, 30]:
    # SS_res = 81 + 324 + 729 = 1134, SS_tot = 2 -> 567; the fitted 1 - r^2 is 0 (a perfect line).
    assert S.one_minus_r2([10, 20, 30], [1, 2, 3]) == pytest.approx(567.0)
    assert S.one_minus_r2_fit([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0, abs=1e-9)


def test_specs_table2_one_minus_r2_matches_torchmetrics_r2_score():
    # torchmetrics' r2_score(preds, target) is the unfitted R^2 (as scikit-learn's r2_score(y_true, y_pred))
    import torch
    from torchmetrics.functional import r2_score

    rng = np.random.default_rng(5)
    human = rng.integers(1, 6, 300).astype(float)
    metric = 0.4 * human + rng.normal(1.0, 1.2, 300)
    ref = 1 - float(r2_score(torch.tensor(metric), torch.tensor(human)))
    assert S.one_minus_r2(metric, human) == pytest.approx(ref, rel=1e-9)
    # never below the fitted value (the least-squares line is the best linear predictor)
    assert S.one_minus_r2(metric, human) >= S.one_minus_r2_fit(metric, human) / 100 - 1e-12


def test_unscaled_stat_is_marked():
    s = S.correlation_stat([1, 2, 3], [1, 2, 4], "one_minus_r2")
    assert s.value == pytest.approx(9 / 42) and "x1" in s.note
    assert "one_minus_r2" in S.UNSCALED and "one_minus_r2_fit" not in S.UNSCALED


def test_against_scipy_on_random_data_with_ties():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 6, 200).astype(float)  # many ties
    y = x + rng.integers(0, 4, 200)
    assert S.kendall_tau(x, y, variant="b") == pytest.approx(100 * st.kendalltau(x, y, variant="b").statistic)
    assert S.kendall_tau(x, y, variant="c") == pytest.approx(100 * st.kendalltau(x, y, variant="c").statistic)
    assert S.spearman(x, y) == pytest.approx(100 * st.spearmanr(x, y).statistic)
    assert S.pearson(x, y) == pytest.approx(100 * np.corrcoef(x, y)[0, 1])


@pytest.mark.parametrize("fn", [S.pearson, S.spearman, S.one_minus_r2, S.one_minus_r2_fit, lambda a, b: S.kendall_tau(a, b, variant="c")])
def test_constant_input_is_an_error_not_nan(fn):
    with pytest.raises(CapscoreError, match="human scores are constant"):
        fn([1, 2, 3], [2, 2, 2])
    with pytest.raises(CapscoreError, match="metric scores are constant"):
        fn([0.5, 0.5, 0.5], [1, 2, 3])


def test_bad_inputs():
    with pytest.raises(CapscoreError, match="position 1"):
        S.pearson([1, float("nan"), 3], [1, 2, 3])
    with pytest.raises(CapscoreError, match="differ in length"):
        S.pearson([1, 2, 3], [1, 2])
    with pytest.raises(CapscoreError, match="at least 2"):
        S.pearson([1], [1])
    with pytest.raises(CapscoreError, match="unknown statistic"):
        S.correlation([1, 2], [1, 2], kind="kendal")


def test_sample_tau_by_hand():
    # g1 perfectly ordered (tau 1), g2 one swap of three (tau-b 1/3), g3 a single item and
    # g4 constant human scores: no tau, left out of the mean.
    metric = [1, 2, 3, 1, 2, 3, 7, 1, 2]
    human = [1, 2, 3, 1, 3, 2, 4, 5, 5]
    groups = ["g1"] * 3 + ["g2"] * 3 + ["g3"] + ["g4"] * 2
    value, used, left = S.sample_tau(metric, human, groups)
    assert value == pytest.approx(100 * (1 + 1 / 3) / 2)
    assert (used, left) == (2, 2)
    with pytest.raises(CapscoreError, match="undefined"):
        S.sample_tau([1, 2], [3, 3], ["a", "a"])


def test_pairwise_accuracy_and_ties():
    a, b, label = [1, 2, 3, 3], [0, 3, 3, 1], [0, 1, 0, 1]
    # right, right, tie, wrong
    assert S.pairwise_accuracy(a, b, label, ties="half") == pytest.approx(62.5)
    assert S.pairwise_accuracy(a, b, label, ties="loss") == pytest.approx(50.0)
    acc = S.accuracy_by_category(a, b, label, ["HC", "HC", "MM", "MM"], ties="half")
    assert acc == pytest.approx({"HC": 100.0, "MM": 25.0, "mean": 62.5})
    with pytest.raises(CapscoreError, match="labels"):
        S.pairwise_accuracy([1], [2], [2])


def test_category_mean_is_unweighted():
    # HC: 3 pairs all right (100); HI: 1 pair wrong (0) -> mean 50, not 75
    stats = S.accuracy_stats([1, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0], ["HC", "HC", "HC", "HI"])
    assert {s.name: s.value for s in stats} == pytest.approx({"HC": 100.0, "HI": 0.0, "mean": 50.0})


def test_system_level_by_hand():
    metric = [1, 2, 3, 3, 5]
    human = [1, 1, 2, 4, 2]
    systems = ["A", "A", "B", "B", "C"]
    value, k = S.system_level(metric, human, systems, kind="pearson")
    # per-system means, by hand: A (1.5, 1), B (3, 3), C (5, 2)
    assert k == 3
    assert value == pytest.approx(100 * st.pearsonr([1.5, 3, 5], [1, 3, 2]).statistic)
    with pytest.raises(CapscoreError, match="at least 2 systems"):
        S.system_level([1, 2], [1, 2], ["A", "A"])


def test_bootstrap_is_seeded_and_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = x + rng.normal(size=60)
    s1 = S.correlation_stat(x, y, "pearson", n_resamples=300, seed=5)
    s2 = S.correlation_stat(x, y, "pearson", n_resamples=300, seed=5)
    s3 = S.correlation_stat(x, y, "pearson", n_resamples=300, seed=6)
    assert s1 == s2 and s1.ci != s3.ci
    assert s1.ci[0] < s1.value < s1.ci[1]
    ref = st.bootstrap((x, y), lambda a, b: 100 * st.pearsonr(a, b).statistic, paired=True, vectorized=False,
                       n_resamples=300, method="percentile", rng=np.random.default_rng(5))
    assert s1.ci == pytest.approx((ref.confidence_interval.low, ref.confidence_interval.high))
    assert S.correlation_stat(x, y, "pearson", n_resamples=0).ci is None


def test_bootstrap_with_undefined_resamples_reports_no_interval():
    # 3 items, two equal: many resamples are constant -> tau undefined there -> no interval
    s = S.correlation_stat([1, 2, 3], [1, 1, 2], "tau_b", n_resamples=200, seed=0)
    assert s.ci is None and s.value == pytest.approx(100 * st.kendalltau([1, 2, 3], [1, 1, 2]).statistic)
