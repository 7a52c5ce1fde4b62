"""CLIPScore-family formulas against values computed by hand."""
import math

import pytest
import torch

from capscore.errors import CapscoreError
from capscore.scores import clip_s, get_metric, harmonic_mean, ref_clip_s, ref_similarity


def unit(*xs):
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.norm()


def test_clip_s_weight_and_clamp_per_pair():
    img = torch.stack([unit(1, 0), unit(1, 0)])
    txt = torch.stack([unit(1, 1), unit(-1, 0.2)])  # cos = 1/sqrt(2) and negative
    out = clip_s(img, txt)
    assert out[0].item() == pytest.approx(2.5 / math.sqrt(2), abs=1e-6)
    assert out[1].item() == 0.0  # clamped per pair, not the mean
    assert clip_s(img, txt, w=2.0)[0].item() == pytest.approx(2.0 / math.sqrt(2), abs=1e-6)


def test_refclip_s_hand_computed():
    img = unit(1, 0).unsqueeze(0)
    cand = unit(0.6, 0.8).unsqueeze(0)  # cos(img, cand) = 0.6 -> CLIP-S = 1.5
    refs = torch.stack([unit(0, 1), unit(0.6, 0.8), unit(1, 0)]).unsqueeze(0)  # cos: 0.8, 1.0, 0.6
    mask = torch.tensor([[True, False, True]])  # the perfect ref is padding, max = 0.8
    expected = 2 * 1.5 * 0.8 / (1.5 + 0.8)
    assert ref_clip_s(img, cand, refs, mask).item() == pytest.approx(expected, abs=1e-6)


def test_ref_similarity_clamps_and_zero_harmonic_is_zero():
    cand = unit(1, 0).unsqueeze(0)
    refs = unit(-1, 0).view(1, 1, 2)
    assert ref_similarity(cand, refs, torch.tensor([[True]])).item() == 0.0
    img = unit(-1, 0).unsqueeze(0)  # CLIP-S 0 and ref 0: harmonic mean 0, not NaN
    assert ref_clip_s(img, cand, refs, torch.tensor([[True]])).item() == 0.0
    assert harmonic_mean(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0


def test_reference_metric_without_references_is_an_error():
    with pytest.raises(CapscoreError):
        ref_similarity(unit(1, 0).unsqueeze(0), torch.zeros(1, 1, 2), torch.tensor([[False]]))


def test_metric_registry_weights_prefixes_and_did_you_mean():
    assert get_metric("clip-s").w == 2.5 and get_metric("pac-s").w == 2.0
    assert get_metric("refpac-s").needs_refs and not get_metric("mcs").needs_refs
    assert get_metric("clip-s").prefix_for("image") == "A photo depicts "
    assert get_metric("clip-s").prefix_for("video") == "" and get_metric("clip-s").prefix_for("image", "") == ""
    assert get_metric("cosine").w == 1.0 and get_metric("cosine").clamp is False and get_metric("clip-s").clamp
    with pytest.raises(CapscoreError, match="did you mean 'clip-s'"):
        get_metric("clip_s")
