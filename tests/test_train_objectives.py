"""Objectives on tiny tensors against values computed by hand (math module, not the code under test)."""
from __future__ import annotations

import math

import pytest
import torch

from capscore.errors import CapscoreError
from capscore.train.objectives import (
    contrastive_loss,
    distillation_loss,
    pacs_loss,
    prmcs_loss,
    specs_loss,
)


def unit_at(*angles_deg):
    """(B, 2) unit vectors at the given angles from e1: cos to e1 is cos(angle)."""
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles_deg])


def lse(*xs):
    return math.log(sum(math.exp(x) for x in xs))


# ----------------------------------------------------------------------------- contrastive
def test_contrastive_orthonormal_pairs():
    eye = torch.eye(2)
    for s in (1.0, 10.0):
        # each row/column: logits (s, 0), target 0  ->  log(1 + e^{-s})
        assert contrastive_loss(eye, eye, s).item() == pytest.approx(math.log1p(math.exp(-s)), rel=1e-6, abs=1e-6)


def test_contrastive_asymmetric_hand_values():
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[2.0, 0.0], [1.0, 1.0]])  # normalised: e1, (r, r) with r = 1/sqrt 2
    r = 1 / math.sqrt(2)
    # logits[i][j] = cos(image_i, text_j): [[1, r], [0, r]]
    i2t = ((-1 + lse(1, r)) + (-r + lse(0, r))) / 2
    t2i = ((-1 + lse(1, 0)) + (-r + lse(r, r))) / 2
    assert contrastive_loss(image, text, 1.0).item() == pytest.approx((i2t + t2i) / 2, rel=1e-6)
    assert contrastive_loss(image, text, 1.0, symmetric=False).item() == pytest.approx(t2i, rel=1e-6)


def test_contrastive_shape_error_is_user_error():
    with pytest.raises(CapscoreError, match="same shape"):
        contrastive_loss(torch.zeros(2, 3), torch.zeros(3, 3), 1.0)


# ----------------------------------------------------------------------------- SPECS
def specs_hand(cb, cd, cn, margin, s=1.0, beta=8.0, gamma=0.8, high=1.5, fixed=None):
    """SPECS by hand for a batch whose images are all e1 (so the contrastive part is log B)."""
    B = len(cb)
    tb, td, tn = ([s * c for c in xs] for xs in (cb, cd, cn))
    m1 = fixed if fixed is not None else margin
    det = sum(max(0.0, m1 + b - d) for b, d in zip(tb, td)) / B
    eps = fixed if fixed is not None else min(high, max(0.0, sum(d - b for b, d in zip(tb, td)) / B))
    neg = sum(max(0.0, eps + n - b) for b, n in zip(tb, tn)) / B
    eps2 = fixed if fixed is not None else min(high, max(0.0, sum(b - n for b, n in zip(tb, tn)) / B))
    return math.log(B) + beta * det + gamma * neg, beta * det, gamma * neg, eps2


def specs_inputs(base_deg, det_deg, neg_deg):
    B = len(base_deg)
    image = torch.tensor([[1.0, 0.0]] * B)
    caption = unit_at(*det_deg)
    return image, caption, unit_at(*base_deg), unit_at(*det_deg), unit_at(*neg_deg)


def test_specs_hinge_and_dynamic_margin_update():
    base, det, neg = (30, 50), (20, 60), (40, 10)
    cos = lambda xs: [math.cos(math.radians(a)) for a in xs]
    out = specs_loss(*specs_inputs(base, det, neg), 1.0, margin=0.05)
    total, d, n, eps = specs_hand(cos(base), cos(det), cos(neg), 0.05)
    assert out.contrastive.item() == pytest.approx(math.log(2), rel=1e-6)  # identical images: log B
    assert out.detail.item() == pytest.approx(d, rel=1e-5)
    assert out.negative.item() == pytest.approx(n, rel=1e-5)
    assert out.loss.item() == pytest.approx(total, rel=1e-5)
    assert out.margin == pytest.approx(eps, rel=1e-5)
    # hinge active in both terms, margin after the detail term is its mean gap
    assert d > 0 and n > 0


def test_specs_margin_clamped_to_range():
    cos = lambda xs: [math.cos(math.radians(a)) for a in xs]
    # scale 10: mean gap of (base - neg) is 10·(cos 0 − cos 80) > 1.5  -> clamp to 1.5
    base, det, neg = (0, 0), (60, 60), (80, 80)
    out = specs_loss(*specs_inputs(base, det, neg), 10.0)
    total, d, n, eps = specs_hand(cos(base), cos(det), cos(neg), 0.0, s=10.0)
    assert eps == 1.5 and out.margin == pytest.approx(1.5)
    assert out.loss.item() == pytest.approx(total, rel=1e-5)
    # details that lower the score: the detail-term margin would be negative -> 0 for the negative term
    out2 = specs_loss(*specs_inputs((0, 0), (60, 60), (0, 0)), 1.0)
    # neg term: eps after detail = clamp(mean(cos60 - cos0) < 0) = 0, gap base-neg = 0 -> relu(0) = 0
    assert out2.negative.item() == pytest.approx(0.0, abs=1e-7)
    assert out2.margin == 0.0


def test_specs_fixed_margin_only_when_set():
    cos = lambda xs: [math.cos(math.radians(a)) for a in xs]
    base, det, neg = (30, 50), (20, 60), (40, 10)
    out = specs_loss(*specs_inputs(base, det, neg), 1.0, margin=0.9, fixed_margin=0.2)
    total, d, n, eps = specs_hand(cos(base), cos(det), cos(neg), None, fixed=0.2)
    assert out.loss.item() == pytest.approx(total, rel=1e-5)
    assert out.margin == 0.2


def test_specs_weights_default_alpha_beta_gamma():
    x = specs_inputs((30, 50), (20, 60), (40, 10))
    a = specs_loss(*x, 1.0, margin=0.1)
    b = specs_loss(*x, 1.0, margin=0.1, alpha=2.0, beta=1.0, gamma=1.0)
    assert a.detail.item() == pytest.approx(8 * b.detail.item(), rel=1e-6)
    assert a.negative.item() == pytest.approx(0.8 * b.negative.item(), rel=1e-6)
    assert b.contrastive.item() == pytest.approx(2 * a.contrastive.item(), rel=1e-6)


def test_specs_printed_equations_cosine_theta_per_batch_margin_by_hand():
    # cos: base (30°, 50°) = 0.866025, 0.642788; +d (10°, 45°) = 0.984808, 0.707107; +d- (40°, 70°) = 0.766044, 0.342020
    x = specs_inputs((30, 50), (10, 45), (40, 70))
    out = specs_loss(*x, 10.0, theta="cosine", margin_mode="per-batch")
    # eq. 3 (sign from the prose), θ = cosine: ε+ = mean(0.118783, 0.064319) = 0.091551 (this batch's own gap)
    # L_detail = mean(relu(0.091551 - 0.118783), relu(0.091551 - 0.064319)) = mean(0, 0.027232) = 0.013616
    assert out.detail.item() == pytest.approx(8 * 0.013616, abs=8e-6)
    # by analogy: ε- = mean(base - neg) = mean(0.099981, 0.300768) = 0.200375
    # L_neg = mean(relu(0.200375 - 0.099981), relu(0.200375 - 0.300768)) = mean(0.100394, 0) = 0.050197
    assert out.negative.item() == pytest.approx(0.8 * 0.050197, abs=1e-6)
    assert out.contrastive.item() == pytest.approx(math.log(2), rel=1e-6)  # the contrastive term keeps the scale
    assert out.margin == pytest.approx(0.200375, abs=1e-6)


def test_specs_reference_default_differs_from_printed_equations_on_the_same_batch():
    x = specs_inputs((30, 50), (10, 45), (40, 70))
    ref = specs_loss(*x, 10.0)  # logits (scale 10), carried margin 0 for the detail hinge
    # detail: relu(0 + 10·(b - d)) = relu(-1.18783), relu(-0.64319) -> 0
    assert ref.detail.item() == pytest.approx(0.0, abs=1e-6)
    # then ε = clamp(mean 10·gap = 0.91551) and the negative hinge uses it: relu(0.91551 - 0.99981), relu(0.91551 - 3.00768)
    assert ref.negative.item() == pytest.approx(0.0, abs=1e-6)
    assert ref.margin == pytest.approx(min(1.5, 10 * 0.200375), abs=1e-5)  # carried: clamped to 1.5
    with pytest.raises(CapscoreError, match="'theta' parameter"):
        specs_loss(*x, 10.0, theta="cos")
    with pytest.raises(CapscoreError, match="'margin_mode' parameter"):
        specs_loss(*x, 10.0, margin_mode="batch")


# ----------------------------------------------------------------------------- PR-MCS
def test_prmcs_terms_and_margin_floor():
    image = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    orig = unit_at(20, 40)
    pert = unit_at(30, 89)  # cos(V, p): cos30 (> m), cos89 ≈ 0.017 (< m: floored at 0.1)
    out = prmcs_loss(image, orig, pert, 1.0)
    c = lambda a: math.cos(math.radians(a))
    # L_CLIP with identical images: image->text rows logits (c20, c40); text->image: log 2
    i2t = ((-c(20) + lse(c(20), c(40))) + (-c(40) + lse(c(20), c(40)))) / 2
    clip = (i2t + math.log(2)) / 2
    align = 0.1 * ((1 - c(20)) + (1 - c(40))) / 2
    img_p = 0.05 * (max(0.1, c(30)) + max(0.1, c(89))) / 2
    txt_p = 0.05 * (max(0.1, c(10)) + max(0.1, c(49))) / 2  # angle between o and p: 10°, 49°
    assert out.clip.item() == pytest.approx(clip, rel=1e-5)
    assert out.align.item() == pytest.approx(align, rel=1e-5)
    assert out.image_perturbed.item() == pytest.approx(img_p, rel=1e-5)
    assert out.text_perturbed.item() == pytest.approx(txt_p, rel=1e-5)
    assert out.loss.item() == pytest.approx(clip + align + img_p + txt_p, rel=1e-5)


def test_prmcs_floor_stops_gradient_below_margin():
    image = torch.tensor([[1.0, 0.0]])
    orig = torch.tensor([[0.0, 1.0]])
    pert = unit_at(89.5).requires_grad_(True)  # cos to both V and o ... V: ~0.009 < 0.1
    out = prmcs_loss(image, orig, pert, 1.0, lambdas=(0.0, 1.0, 0.0))
    out.image_perturbed.backward()
    assert torch.all(pert.grad == 0)
    assert out.image_perturbed.item() == pytest.approx(0.1)


def test_prmcs_multiple_perturbations_average():
    image = torch.tensor([[1.0, 0.0]])
    orig = unit_at(0)
    pert = unit_at(60, 0)[None]  # (1, K=2, 2)
    out = prmcs_loss(image, orig, pert, 1.0)
    assert out.image_perturbed.item() == pytest.approx(0.05 * (0.5 + 1.0) / 2, rel=1e-5)


# ----------------------------------------------------------------------------- distillation
def test_distillation_mse_by_hand_and_teacher_detached():
    s = torch.tensor([[1.0, 2.0], [0.0, -1.0]], requires_grad=True)
    t = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    loss = distillation_loss(s, t)
    assert loss.item() == pytest.approx((1 + 4 + 1 + 4) / 4)
    loss.backward()
    assert t.grad is None and torch.allclose(s.grad, torch.tensor([[0.5, 1.0], [-0.5, -1.0]]))
    with pytest.raises(CapscoreError):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4))


# ----------------------------------------------------------------------------- PAC-S
def test_pacs_augmented_infonce_by_hand():
    """pac-s.txt's L(V,T) is the SUM of the two directions' mean cross-entropies (no 1/2)."""
    eye = torch.eye(2)
    swapped = eye.flip(0)  # generated images matched to the wrong captions: logits (0, s) target 0
    s = 2.0
    out = pacs_loss(eye, eye, swapped, eye, s, lambda_v=0.5, lambda_t=0.25)
    right = math.log1p(math.exp(-s))  # -log softmax of the diagonal, per row and per column
    wrong = -0 + lse(0, s)
    assert out.real.item() == pytest.approx(2 * right, rel=1e-6)  # i->t + t->i
    assert out.generated_images.item() == pytest.approx(0.5 * 2 * wrong, rel=1e-6)
    assert out.generated_texts.item() == pytest.approx(0.25 * 2 * right, rel=1e-6)
    assert out.loss.item() == pytest.approx(2 * right + wrong + 0.5 * right, rel=1e-6)
    half = pacs_loss(eye, eye, swapped, eye, s, lambda_v=0.5, lambda_t=0.25, directions="mean")
    assert half.loss.item() == pytest.approx(right + 0.5 * wrong + 0.25 * right, rel=1e-6)
    with pytest.raises(CapscoreError):
        pacs_loss(eye, eye, swapped, eye, s, directions="max")


def test_objectives_stay_fp32_inside_bf16_autocast():
    """Under ``capscore train --amp bf16`` the towers hand bf16 vectors to the objectives; the logits,
    FILIP maxima and losses must still be computed in fp32: the same numbers as fp32 code on the same
    (upcast) inputs, not bf16 numbers (at scale 30 a bf16 logit is off by up to 0.125)."""
    from capscore.train.objectives import filip_loss, hard_negative_contrastive_loss

    g = torch.Generator().manual_seed(0)
    img, pos, neg = (torch.randn(6, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    patches = torch.randn(6, 9, 16, generator=g).to(torch.bfloat16)
    tokens = torch.randn(12, 5, 16, generator=g).to(torch.bfloat16)
    mask = torch.ones(12, 5, dtype=torch.bool)
    mask[::2, 3:] = False
    want_hn, _ = hard_negative_contrastive_loss(img.float(), pos.float(), neg.float(), 30.0)
    want_filip = filip_loss(patches.float(), tokens.float(), mask, 30.0, negative_columns="own")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_hn, _ = hard_negative_contrastive_loss(img, pos, neg, 30.0)
        got_filip = filip_loss(patches, tokens, mask, 30.0, negative_columns="own")
        bf16_logits = (30.0 * img.float() @ pos.float().T).dtype  # what autocast does to a bare matmul
    assert bf16_logits == torch.bfloat16
    assert got_hn.dtype == got_filip.dtype == torch.float32
    assert torch.equal(got_hn, want_hn) and torch.equal(got_filip, want_filip)
