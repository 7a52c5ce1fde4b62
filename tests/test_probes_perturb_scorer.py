"""The perturb probe scores with a metric: MCS = 2.5 * max(0, cos) by default (PR-MCS §3.1, Tables 2 and 7).

A fake encoder gives every image the vector (1, 0) and every text a unit vector with a chosen cosine to it,
so each expected number is computed by hand from the cosines below.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from capscore.probes import run as R
from capscore.scores.pairs import get_pair_scorer

COS = {
    "a dog runs": 0.40, "[MASK] [MASK] [MASK]": 0.05,
    "red ball": 0.30, "[MASK] [MASK]": -0.20,  # the clamped pair: MCS 0, cosine -0.20
}


class _Backbone:
    spec, identity = "fake", "fake|cos-table"


class CosEncoder:
    backbone = _Backbone()

    def __init__(self):
        self.texts = []

    def encode_images(self, images):
        return torch.tensor([[1.0, 0.0]] * len(images), dtype=torch.float64)

    def encode_texts(self, texts):
        self.texts += list(texts)
        c = [COS[t.removeprefix("A photo depicts ")] for t in texts]  # the prefix does not move these cosines
        return torch.tensor([[x, math.sqrt(1 - x ** 2)] for x in c], dtype=torch.float64)


def _items():
    return [R.ProbeItem("0", "img0", "a dog runs", lang="en"), R.ProbeItem("1", "img1", "red ball", lang="en")]


def test_perturb_default_is_mcs_by_hand_with_a_clamped_pair():
    res = R.run_perturb(CosEncoder(), _items(), kinds=["masking"], p=1.0)  # p = 1: every word masked
    m = next(s for s in res.summary if s["kind"] == "masking")
    assert res.scorer == "mcs"
    # MCS: originals 2.5 * .40 = 1.0 and 2.5 * .30 = .75; masked 2.5 * .05 = .125 and 2.5 * max(0, -.2) = 0
    assert m["mean_original"] == pytest.approx((1.0 + 0.75) / 2)
    assert m["mean_perturbed"] == pytest.approx(0.125 / 2)
    assert m["pct_change"] == pytest.approx(100 * (0.0625 - 0.875) / 0.875)  # -92.857 %
    assert m["mean_score_drop"] == pytest.approx(((1.0 - 0.125) + (0.75 - 0.0)) / 2)
    # on the raw cosine the same captions drop by more than 100 %: (-.075 - .35) / .35 = -121.4 %
    cos = R.run_perturb(CosEncoder(), _items(), kinds=["masking"], p=1.0, scorer=get_pair_scorer("cosine"),
                        scorer_name="cosine")
    c = next(s for s in cos.summary if s["kind"] == "masking")
    assert c["pct_change"] == pytest.approx(100 * ((0.05 - 0.20) / 2 - 0.35) / 0.35)
    assert c["pct_change"] < -100 < m["pct_change"]


@pytest.mark.parametrize("name,w,prefix", [("mcs", 2.5, ""), ("clip-s", 2.5, "A photo depicts "),
                                           ("pac-s", 2.0, "A photo depicts ")])
def test_metric_pair_scorers_weight_clamp_and_prefix(name, w, prefix):
    enc = CosEncoder()
    got = get_pair_scorer(name)(enc, ["i", "i"], ["red ball", "[MASK] [MASK]"])
    assert got.tolist() == pytest.approx([w * 0.30, 0.0])
    assert enc.texts == [prefix + "red ball", prefix + "[MASK] [MASK]"]
    enc.texts.clear()
    get_pair_scorer(name, prefix="")(enc, ["i"], ["red ball"])
    assert enc.texts == ["red ball"]


def test_reference_metrics_and_unknown_names_are_refused():
    with pytest.raises(Exception, match="needs references"):
        get_pair_scorer("refclip-s")
    with pytest.raises(Exception, match="did you mean 'mcs'"):
        get_pair_scorer("mcz")
    with pytest.raises(Exception, match="ABE-CLIP's options apply to scorer abe only; got 'mcs'"):
        get_pair_scorer("mcs", k=3)


def test_cli_perturb_reports_mcs_by_default(tmp_path, make_images, tiny_backbone):
    """The CLI's default scorer for --suite perturb is MCS; its mean original equals 2.5 * mean(max(0, cos))
    recomputed here from the encoder's vectors."""
    from capscore.cli import main
    from capscore.embed.engine import Encoder

    paths = make_images(2, size=32)
    f = tmp_path / "caps.jsonl"
    caps = ["a dog runs on the grass", "two red balls lie under a table"]
    f.write_text("".join(json.dumps({"image": p.name, "caption": c, "lang": "en"}) + "\n" for p, c in zip(paths, caps)))
    out = tmp_path / "o"
    assert main(["-q", "probe", "--model", "capscore-test-tiny", "--suite", "perturb", "--kinds", "masking",
                 "--data", str(f), "--images", str(paths[0].parent), "--out", str(out)]) == 0
    s = json.loads((out / "perturb.summary.json").read_text())[0]
    assert s["scorer"] == "mcs" and s["prefix"] == ""
    enc = Encoder(tiny_backbone)
    cos = (enc.encode_images(paths) * enc.encode_texts(caps)).sum(-1).double()
    row = next(r for r in s["summary"] if r["kind"] == "masking")
    assert row["mean_original"] == pytest.approx(float((2.5 * cos.clamp(min=0)).mean()), abs=1e-6)
