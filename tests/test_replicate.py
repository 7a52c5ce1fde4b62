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


@pytest.mark.slow  # a replication's smoke run
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


@pytest.mark.slow  # a replication's smoke run
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


@pytest.mark.slow  # a replication's smoke run
def test_smoke_prmcs_trains_each_arm_once_and_reports_percent_drops(tmp_path):
    out, work = tmp_path / "rep.md", tmp_path / "runs"
    argv = ["--smoke", "--experiment", "prmcs", "--seeds", "0", "1", "--work", str(work), "--out", str(out)]
    assert rep.main(argv) == 0
    models = sorted(p.parent for p in work.glob("prmcs-s0/*/model.safetensors"))
    assert [m.name for m in models] == ["distill", "ft-0.1-0.0-0.0", "ft-0.1-0.05-0.05", "ft-0.1-0.5-0.5"]
    metrics = {ln.split("|")[3].strip() for ln in out.read_text().splitlines() if ln.startswith("| prmcs |")}
    for name in ["teacher", "distilled", *rep.PRMCS_ARMS]:
        assert {f"{name}: {lang}, all perturbations" for lang in rep.PRMCS_LANGS} <= metrics
        assert f"{name}: substitution, all languages" in metrics and f"{name}: jumble, all languages" in metrics
    stamps = [m.joinpath("model.safetensors").stat().st_mtime_ns for m in models]
    assert rep.main(argv) == 0  # a rerun reuses the finished runs instead of training again
    assert [m.joinpath("model.safetensors").stat().st_mtime_ns for m in models] == stamps


class _Enc:
    """cos(image i, text t) = the number written in t (images are unit vectors e_0)."""

    def encode_texts(self, texts):
        import torch

        vals = [float(t.split()[0]) if t.split()[0].replace(".", "").isdigit() else 0.0 for t in texts]
        return torch.tensor([[v, (1 - v * v) ** 0.5] for v in vals])


def test_percent_drop_is_one_minus_the_ratio_of_mean_scores(monkeypatch):
    import torch

    import capscore.perturb.prmcs as P

    class Scene:
        def __init__(self, c):
            self.c = c

        def short_caption(self, lang):
            return f"{self.c} a red square"

    # every perturbation maps the caption to cosine 0.2 (and -0.3 for the last: clamped to 0)
    def fake(text, kind, **_):
        v = "-0.3" if text.startswith("0.8") else "0.2"
        return P.Perturbed(original=text, kind=kind, text=f"{v} x")

    monkeypatch.setattr(P, "perturb", fake)
    scenes = [Scene(c) for c in ("0.6", "0.4", "0.8")]
    img = torch.tensor([[1.0, 0.0]] * 3)
    drops = rep._drops_pct(_Enc(), scenes, img, "de", 0)
    assert set(drops) == set(P.PERTURBATIONS) - {"substitution"}
    # mean s(o) = 0.6; mean s(p) = (0.2 + 0.2 + 0) / 3; the paper's % drop = 100 (1 - s(p)/s(o))
    expected = 100 * (1 - (0.4 / 3) / 0.6)
    for v in drops.values():
        assert v.mean() == pytest.approx(expected)


def test_specs_wrong_units_are_false_facts_about_the_image_and_true_units_are_true():
    from capscore.scenes import captions as C
    from capscore.scenes import generate_scenes

    checked = 0
    for i, scene in enumerate(generate_scenes(30, seed=7, split="heldout")):
        truth = C.truth(scene)
        true, wrong = rep._true_and_wrong_units(scene, np.random.default_rng([0, i]))
        assert len(wrong) == len(true) - 1
        for u in true:
            assert u.facts() <= truth
        for k, w in enumerate(wrong):
            assert w.facts() - truth, (scene.id, k, w)  # states something the image does not show
            assert w.form == true[k + 1].form  # same kind of detail as the true unit it replaces
            checked += 1
    assert checked > 60


@pytest.mark.slow  # a replication's smoke run
def test_smoke_specs_trains_a_shared_start_and_two_arms(tmp_path):
    out, work = tmp_path / "rep.md", tmp_path / "runs"
    assert rep.main(["--smoke", "--experiment", "specs", "--seeds", "0", "1", "--work", str(work),
                     "--out", str(out)]) == 0
    assert sorted(p.parent.name for p in work.glob("specs-s1/*/model.safetensors")) == ["control", "long", "specs"]
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| specs |")]
    assert "SR_neg, another scene's unit (triplets)" in rep.SR_METRICS  # the paper's kind of negative too
    for arm in ("stretched + long contrastive (start)", "+ SPECS", "+ contrastive (control)"):
        for metric in rep.SR_METRICS:
            (row,) = [r for r in rows if r.split("|")[3].strip() == f"{arm}: {metric}"]
            assert 0.0 <= float(row.split("|")[6]) <= 1.0
    mean = {r.split("|")[3].strip(): float(r.split("|")[6]) for r in rows}
    for metric in rep.SR_METRICS:  # paired rows
        assert mean[f"+ SPECS − control: {metric}"] == pytest.approx(
            mean[f"+ SPECS: {metric}"] - mean[f"+ contrastive (control): {metric}"], abs=2e-3)


@pytest.mark.slow  # a replication's smoke run
def test_smoke_specs_grid_trains_each_table5_row_from_the_shared_start(tmp_path):
    import json

    out, work = tmp_path / "rep.md", tmp_path / "runs"
    assert rep.main(["--smoke", "--experiment", "specs-grid", "--seeds", "0", "1", "--work", str(work),
                     "--out", str(out)]) == 0
    runs = {p.parent.name: json.loads((p.parent / "card.json").read_text())
            for p in work.glob("specs-s1/*/model.safetensors")}
    assert sorted(runs) == ["grid-beta9", "grid-fixed_margin0.001", "grid-gamma0.6", "grid-gamma8",
                            "grid-negativescontrolled", "long", "specs"]
    paper = runs["specs"]["recipe_params"]
    assert (paper["alpha"], paper["beta"], paper["gamma"], paper["fixed_margin"]) == (1.0, 8.0, 0.8, None)
    changed = {"grid-beta9": {"beta": 9.0}, "grid-gamma0.6": {"gamma": 0.6},
               "grid-fixed_margin0.001": {"fixed_margin": 0.001}, "grid-gamma8": {"gamma": 8.0},
               "grid-negativescontrolled": {"negatives": "controlled"}}
    for name, diff in changed.items():  # each row differs from the paper's setting in its own knob only
        p = runs[name]["recipe_params"]
        assert {k: v for k, v in p.items() if paper.get(k) != v} == diff
        assert runs[name]["base_model"] == runs["specs"]["base_model"]
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| specs-grid |")]
    mean = {r.split("|")[3].strip(): float(r.split("|")[6]) for r in rows}
    for row in rep.SPECS_GRID:
        assert 0.0 <= mean[f"{row}: SR mean (per image)"] <= 1.0
    for row in list(rep.SPECS_GRID)[1:]:
        assert mean[f"{row} − paper: SR mean (per image)"] == pytest.approx(
            mean[f"{row}: SR mean (per image)"] - mean["1:8:0.8 (paper): SR mean (per image)"], abs=2e-3)
    # --grid-rows picks rows (finished runs are reused); the paper's row is always measured
    out2 = tmp_path / "rep2.md"
    assert rep.main(["--smoke", "--experiment", "specs-grid", "--grid-rows", "grid-gamma8", "--work", str(work),
                     "--out", str(out2)]) == 0
    arms = {r.split("|")[3].strip().split(": SR")[0] for r in out2.read_text().splitlines()
            if r.startswith("| specs-grid |")}
    assert arms == {"1:8:0.8 (paper)", "1:8:8 (γ ×10)", "1:8:8 (γ ×10) − paper"}


@pytest.mark.slow  # a replication's smoke run
def test_smoke_pacs_trains_three_arms_from_one_start_differing_only_in_lambda(tmp_path):
    import json

    out, work = tmp_path / "rep.md", tmp_path / "runs"
    assert rep.main(["--smoke", "--experiment", "pacs", "--model", "openclip:capscore-test-tiny", "--seeds", "0",
                     "1", "--work", str(work), "--out", str(out)]) == 0
    runs = sorted(p.parent for p in work.glob("pacs-s1/*/model.safetensors"))
    assert [r.name for r in runs] == ["lambda-0.0", "lambda-0.05", "lambda-0.5"]
    cards = [json.loads((r / "card.json").read_text()) for r in runs]
    for card, lam in zip(cards, (0.0, 0.05, 0.5)):
        p = dict(card["recipe_params"])
        assert p.pop("lambda_v") == p.pop("lambda_t") == lam
        assert p == {k: v for k, v in cards[0]["recipe_params"].items() if not k.startswith("lambda")}
        # the same start, data and optimiser in every arm
        assert (card["base_model"], card["data"], card["train_config"]) == (
            cards[0]["base_model"], cards[0]["data"], cards[0]["train_config"])
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| pacs |")]
    for arm in ("start", *rep.PACS_ARMS):
        for metric in ("oracle τ-b", "oracle τ-c", "R@1 image→text"):
            (row,) = [r for r in rows if r.split("|")[3].strip() == f"{arm}: {metric}"]
            lo = 0.0 if metric.startswith("R@1") else -1.0
            assert lo <= float(row.split("|")[6]) <= 1.0
    mean = {r.split("|")[3].strip(): float(r.split("|")[6]) for r in rows}
    control = next(iter(rep.PACS_ARMS))
    for arm in list(rep.PACS_ARMS)[1:]:  # the paired rows are the arm's mean minus the control's
        for metric in ("oracle τ-b", "R@1 image→text"):
            assert mean[f"{arm} − control: {metric}"] == pytest.approx(
                mean[f"{arm}: {metric}"] - mean[f"{control}: {metric}"], abs=2e-3)
