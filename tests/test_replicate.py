"""benchmarks/replicate.py: the smoke mode runs end to end and writes a table with intervals."""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("replicate", Path(__file__).parents[1] / "benchmarks" / "replicate.py")
rep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rep)


def test_seed_interval_is_the_t_interval():
    lo, hi = rep.seed_interval([0.5, 0.7, 0.9])
    half = 4.302652729911275 * 0.2 / math.sqrt(3)  # t(0.975, df=2) from tables; sd = 0.2
    assert (lo, hi) == pytest.approx((0.7 - half, 0.7 + half))
    assert all(math.isnan(x) for x in rep.seed_interval([0.5]))


def test_item_interval_brackets_the_mean_and_collapses_on_constants():
    x = np.array([1.0] * 30 + [0.0] * 10)
    lo, hi = rep.item_interval([x])
    assert lo < 0.75 < hi and hi - lo < 0.35  # binomial sd ≈ 0.068: half-width ≈ 0.13
    assert rep.item_interval([np.ones(5), np.zeros(5)]) == (0.5, 0.5)


def test_smoke_writes_a_table(tmp_path):
    out = tmp_path / "rep.md"
    assert rep.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| flips |")]
    assert {r.split("|")[3].strip() for r in rows} >= {"color", "shape"}
    for r in rows:
        cells = [c.strip() for c in r.split("|")[1:-1]]
        assert cells[3] == "3"  # seeds
        mean = float(cells[5])
        lo, hi = map(float, re.findall(r"-?\d+\.\d+", cells[6]))
        assert 0.0 <= mean <= 1.0 and lo <= mean + 1e-9 and hi >= mean - 1e-9
    assert "Command: `python benchmarks/replicate.py --smoke" in text


def test_smoke_abe_and_lgip_sections(tmp_path):
    out = tmp_path / "rep.md"
    assert rep.main(["--smoke", "--experiment", "abe", "lgip", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("## abe") < text.index("## lgip")
    metrics = {ln.split("|")[3].strip(): ln for ln in text.splitlines() if ln.startswith("| abe |")}
    for row in ("global CLIP-S", "local (S_base)", "+ refinement (S_refine)", "+ binding diff (S_local)"):
        assert f"swap: {row}" in metrics
    assert {f"swap: full w=0.3 K={k}" for k in (1, 3, 5, 8, 10)} <= set(metrics)
    for ln in metrics.values():
        assert 0.0 <= float(ln.split("|")[6]) <= 1.0  # an accuracy
    lgip = {ln.split("|")[3].strip() for ln in text.splitlines() if ln.startswith("| lgip |")}
    assert {"E_inv", "E_sens (all)", "PR (all)", "PR (color)", "PR (object)"} <= lgip
