"""experiments/replicate.py: the smoke mode runs end to end and writes a table with hierarchical intervals.

The smoke runs re-run the research script end to end (minutes on a loaded 2-core machine): ``slow``."""
from __future__ import annotations

import importlib.util
import math
import re
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("replicate", Path(__file__).parents[1] / "experiments" / "replicate.py")
rep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rep)


def test_seed_interval_is_the_t_interval():
    lo, hi = rep.seed_interval([0.5, 0.7, 0.9])
    half = 4.302652729911275 * 0.2 / math.sqrt(3)  # t(0.975, df=2) from tables; sd = 0.2
    assert (lo, hi) == pytest.approx((0.7 - half, 0.7 + half))
    assert all(math.isnan(x) for x in rep.seed_interval([0.5]))


def test_summarise_pools_the_seeds_of_one_model_and_keeps_runs_apart_otherwise():
    a = rep.Items(np.array([1.0, 3.0]), np.array(["x", "y"]))
    b = rep.Items(np.array([5.0, 7.0]), np.array(["x", "y"]))  # same scene ids in another seed: other images
    one = rep.summarise([a, b], runs_vary=False)
    assert (one["runs"], one["images"], one["items"], one["mean"]) == (1, 4, 4, 4.0)
    two = rep.summarise([a, b], runs_vary=True)
    assert (two["runs"], two["images"], two["items"], two["mean"]) == (2, 4, 4, 4.0)
    # two runs: the run effect (means 2 and 6, B = 8) dominates -> SE ≈ sqrt(B/S) = 2; pooled, one run of
    # four images: s² = 20/3 over 4 -> SE ≈ 1.29
    assert two["se"] == pytest.approx(2.0, rel=0.1) and one["se"] == pytest.approx((20 / 3 / 4) ** 0.5, rel=0.1)
    assert two["ci_seeds"] == pytest.approx(rep.seed_interval([2.0, 6.0]))


def test_paired_items_must_match():
    a = rep.Items(np.array([1.0, 0.0]), np.array(["x", "y"]))
    assert list((a - rep.Items(np.array([0.0, 0.0]), np.array(["x", "y"]))).values) == [1.0, 0.0]
    with pytest.raises(ValueError, match="same items"):
        a - rep.Items(np.array([0.0, 0.0]), np.array(["y", "x"]))


def test_evaluation_seeds_avoid_the_selection_seed():
    from capscore.scenes.evaluate import EVAL_SEED

    assert rep.SELECTION_SEED == EVAL_SEED
    assert EVAL_SEED not in range(rep.EVAL_SEED, rep.EVAL_SEED + 100)
    with pytest.raises(SystemExit) as e:
        rep.main(["--eval-seed", str(EVAL_SEED - 1), "--seeds", "0", "1", "--out", "/dev/null"])
    assert e.value.code == 2


def test_fixed_weights_are_one_run_and_random_init_is_one_run_per_seed():
    assert not rep.weights_vary("abe", "scenes-tiny")
    assert rep.weights_vary("abe", "openclip:capscore-test-tiny")
    assert rep.weights_vary("abe", "ckpt:runs/s{seed}/model.safetensors")
    assert rep.weights_vary("specs", "scenes-tiny")


@pytest.mark.slow
def test_smoke_writes_a_table(tmp_path):
    out = tmp_path / "rep.md"
    assert rep.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| flips |")]
    assert {r.split("|")[3].strip() for r in rows} >= {"color", "shape"}
    for r in rows:
        cells = [c.strip() for c in r.split("|")[1:-1]]
        assert cells[4] == "3"  # runs: a random init is one training run per seed
        assert int(cells[5]) == int(cells[6]) > 0  # flips: one item per image and kind
        mean = float(cells[7])
        lo, hi = map(float, re.findall(r"-?\d+\.\d+", cells[8]))
        assert 0.0 <= mean <= 1.0 and lo <= mean + 1e-9 and hi >= mean - 1e-9
    assert "Command: `python experiments/replicate.py --smoke" in text


@pytest.mark.slow
def test_smoke_abe_and_lgip_sections(tmp_path):
    out = tmp_path / "rep.md"
    assert rep.main(["--smoke", "--experiment", "abe", "lgip", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("## abe") < text.index("## lgip")
    metrics = {ln.split("|")[3].strip(): ln for ln in text.splitlines() if ln.startswith("| abe |")}
    for row in ("global CLIP-S", "local (S_base)", "+ refinement (S_refine)", "+ binding diff (S_local)"):
        assert f"swap: {row}" in metrics
    assert {f"swap: full w=0.3 K={k}" for k in (1, 3, 5, 8, 10)} <= set(metrics)
    mean = {m: float(ln.split("|")[8]) for m, ln in metrics.items()}
    for m, v in mean.items():
        assert (-1.0 if "−" in m else 0.0) <= v <= 1.0  # an accuracy, or a difference of two
    # the pre-registered row: the paper's setting (K = 5) minus global CLIP-S on the same items
    assert mean["swap: full K=5 − global CLIP-S"] == pytest.approx(
        mean["swap: full w=0.3 K=5"] - mean["swap: global CLIP-S"], abs=2e-3)
    roles = {m: ln.split("|")[4].strip() for m, ln in metrics.items()}
    assert {m for m, r in roles.items() if r == "headline"} == set(rep.HEADLINE["abe"])
    lgip = {ln.split("|")[3].strip() for ln in text.splitlines() if ln.startswith("| lgip |")}
    assert {"E_inv", "E_sens (all)", "PR (all)", "PR (color)", "PR (object)"} <= lgip


@pytest.mark.slow
def test_smoke_prmcs_trains_each_arm_once_and_reports_percent_drops(tmp_path):
    out, work = tmp_path / "rep.md", tmp_path / "runs"
    argv = ["--smoke", "--experiment", "prmcs", "--seeds", "0", "1", "--work", str(work), "--out", str(out)]
    assert rep.main(argv) == 0
    models = sorted(p.parent for p in work.glob("prmcs-s0/*/model.safetensors"))
    assert [m.name for m in models] == ["distill", "ft-0.1-0.0-0.0", "ft-0.1-0.05-0.05", "ft-0.1-0.5-0.5"]
    metrics = {ln.split("|")[3].strip() for ln in out.read_text().splitlines() if ln.startswith("| prmcs |")}
    for name in ["teacher", "distilled", *rep.PRMCS_ARMS]:
        assert {f"{name}: {lang}, 4 shared kinds" for lang in rep.PRMCS_LANGS} <= metrics
        assert f"{name}: substitution, en" in metrics and f"{name}: jumble, all languages" in metrics
    stamps = [m.joinpath("model.safetensors").stat().st_mtime_ns for m in models]
    assert rep.main(argv) == 0  # a rerun reuses the finished runs instead of training again
    assert [m.joinpath("model.safetensors").stat().st_mtime_ns for m in models] == stamps


class _Enc:
    """Images are the unit vector e_0; cos(image, text) = a number in [-0.3, 0.9] read from the text's CRC-32."""

    backbone = SimpleNamespace(spec="fake", identity="fake")

    @staticmethod
    def cos(text: str) -> float:
        return zlib.crc32(text.encode()) % 1201 / 1000 - 0.3

    def encode_images(self, images):
        import torch

        return torch.tensor([[1.0, 0.0]] * len(images))

    def encode_texts(self, texts):
        import torch

        return torch.tensor([[v, (1 - v * v) ** 0.5] for v in map(self.cos, texts)])


@pytest.mark.parametrize("lang", ["en", "de"])
def test_percent_drop_follows_algorithm_1_and_table_2(lang):
    from capscore.perturb.prmcs import PERTURBATIONS, perturb
    from capscore.probes.scenes import shape_objects

    class Scene:
        def __init__(self, c):
            self.c = c

        def short_caption(self, lang):
            return self.c

        def render(self):
            return "image"

    captions = ["a red square above a blue circle", "two green stars", "red red", "a circle", "square",
                "a small yellow triangle to the left of a large purple square", "three blue crosses and a star"]
    drops = rep._drops_pct(_Enc(), [Scene(c) for c in captions], lang, 31000)
    kinds = PERTURBATIONS if lang == "en" else rep.PRMCS_SHARED_KINDS
    assert tuple(drops) == tuple(kinds)  # languages compared over the same four kinds; substitution: English
    mcs = lambda text: 2.5 * max(_Enc.cos(text), 0.0)  # noqa: E731
    unchanged = 0
    for kind in kinds:
        s_o, s_p, ids = [], [], []
        for i, c in enumerate(captions):  # Algorithm 1 with one seed, no forced change
            p = perturb(c, kind, seed=31000, lang=lang, objects=shape_objects(c) if lang == "en" else None)
            if p.ok or p.unchanged:  # an unchanged caption is emitted as it is: it scores its own score
                s_o.append(mcs(c))
                s_p.append(mcs(p.text) if p.ok else mcs(c))
                ids.append(i)
                unchanged += p.unchanged
        # Table 2: 100 (1 - mean s(perturbed) / mean s(original))
        assert drops[kind].values.mean() == pytest.approx(100 * (1 - np.mean(s_p) / np.mean(s_o)))
        assert list(drops[kind].clusters) == ids  # each scene is its own cluster
    assert unchanged > 0  # the case Algorithm 1 keeps (and ensure_change would have changed) is exercised


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


@pytest.mark.slow
def test_smoke_specs_trains_a_shared_start_and_two_arms(tmp_path):
    out, work = tmp_path / "rep.md", tmp_path / "runs"
    assert rep.main(["--smoke", "--experiment", "specs", "--seeds", "0", "1", "--work", str(work),
                     "--out", str(out)]) == 0
    assert sorted(p.parent.name for p in work.glob("specs-s1/*/model.safetensors")) == ["control", "long", "specs"]
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| specs |")]
    assert "SR_neg, another scene's unit (triplets)" in rep.SR_METRICS  # the paper's kind of negative too
    assert set(rep.SR_REFERENCE) <= set(rep.SR_METRICS)  # the authors' protocol: the headline
    assert rep.HEADLINE["specs"] == tuple(f"+ SPECS − control: {m}" for m in rep.SR_REFERENCE)
    mean = {r.split("|")[3].strip(): float(r.split("|")[8]) for r in rows if r.split("|")[8].strip() != "nan"}
    for arm in ("stretched + long contrastive (start)", "+ SPECS", "+ contrastive (control)"):
        for metric in rep.SR_METRICS:
            assert 0.0 <= mean.get(f"{arm}: {metric}", 0.0) <= 1.0
            assert any(r.split("|")[3].strip() == f"{arm}: {metric}" for r in rows)
    for metric in rep.SR_METRICS[:4]:  # paired rows (the reference rows pair the images both models keep)
        assert mean[f"+ SPECS − control: {metric}"] == pytest.approx(
            mean[f"+ SPECS: {metric}"] - mean[f"+ contrastive (control): {metric}"], abs=2e-3)


@pytest.mark.slow
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
    mean = {r.split("|")[3].strip(): float(r.split("|")[8]) for r in rows}
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


@pytest.mark.slow
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
            assert lo <= float(row.split("|")[8]) <= 1.0
    mean = {r.split("|")[3].strip(): float(r.split("|")[8]) for r in rows}
    control = next(iter(rep.PACS_ARMS))
    for arm in list(rep.PACS_ARMS)[1:]:  # the paired rows are the arm's mean minus the control's
        for metric in ("oracle τ-b", "R@1 image→text"):
            assert mean[f"{arm} − control: {metric}"] == pytest.approx(
                mean[f"{arm}: {metric}"] - mean[f"{control}: {metric}"], abs=2e-3)
