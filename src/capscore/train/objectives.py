"""Training objectives as pure functions of embeddings: no models, no state, no I/O.

Every function takes *unnormalised* joint-space vectors (what ``Backbone.forward_*``
return), normalises them itself, and returns a scalar loss (plus named parts
where the paper has several terms). ``scale`` is the multiplicative logit scale
(``backbone.logit_scale.exp()``), not its logarithm.

=============================  =========================================================
``contrastive_loss``           CLIP symmetric InfoNCE (Radford et al., 2021, fig. 3)
``specs_loss``                 SPECS (Chen et al., 2025, eqs. 3–4) with the dynamic margin
``prmcs_loss``                 PR-MCS fine-tuning (Kim et al., 2023, section 3.4)
``distillation_loss``          multilingual teacher distillation (Kim et al., 2023, 3.1;
                               Carlsson et al., M-CLIP, 2022)
``pacs_loss``                  PAC-S positive-augmented contrastive (Sarto et al., 2023, eq. 2)
=============================  =========================================================
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from capscore.errors import param_error


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.float(), dim=-1)


def _as_scale(scale) -> torch.Tensor:
    return scale if isinstance(scale, torch.Tensor) else torch.tensor(float(scale))


# ----------------------------------------------------------------------------- CLIP
def contrastive_loss(
    image: torch.Tensor, text: torch.Tensor, scale, *, symmetric: bool = True
) -> torch.Tensor:
    """CLIP InfoNCE over a batch of matched pairs (row i of ``image`` matches row i of ``text``).

    logits = scale · cos(image_i, text_j)                       (B, B)
    L = ½ [CE(logits, arange B) + CE(logitsᵀ, arange B)]         (symmetric, CLIP)
    L = CE(logitsᵀ, arange B)   text -> image only               (``symmetric=False``;
                                                                  what SPECS' code uses)
    """
    if image.shape != text.shape or image.ndim != 2:
        raise param_error("image/text", "contrastive_loss", "two (B, D) tensors of the same shape",
                          (tuple(image.shape), tuple(text.shape)))
    logits = _as_scale(scale) * _unit(image) @ _unit(text).T  # (B_img, B_txt)
    target = torch.arange(logits.shape[0], device=logits.device)
    t2i = F.cross_entropy(logits.T, target)
    if not symmetric:
        return t2i
    return 0.5 * (F.cross_entropy(logits, target) + t2i)


# ----------------------------------------------------------------------------- SPECS
@dataclass(frozen=True)
class SpecsLoss:
    """Total and weighted parts of the SPECS loss, plus the margin to use next step."""

    loss: torch.Tensor
    contrastive: torch.Tensor
    detail: torch.Tensor
    negative: torch.Tensor
    margin: float  # ε after both updates: pass it to the next call


def hinge(bigger: torch.Tensor, smaller: torch.Tensor, margin: float) -> torch.Tensor:
    """mean_i relu(ε + smaller_i − bigger_i)."""
    return F.relu(margin + smaller - bigger).mean()


def dynamic_margin(bigger: torch.Tensor, smaller: torch.Tensor, *, low: float = 0.0, high: float = 1.5) -> float:
    """ε = clamp(mean_i(bigger_i − smaller_i), low, high), detached (SPECS code: 0 and 1.5)."""
    return float((bigger.detach() - smaller.detach()).mean().clamp(low, high))


SPECS_THETAS = ("logit", "cosine")
SPECS_MARGINS = ("carried", "per-batch")


def specs_loss(
    image: torch.Tensor,
    caption: torch.Tensor,
    base: torch.Tensor,
    detail: torch.Tensor,
    negative: torch.Tensor,
    scale,
    *,
    margin: float = 0.0,
    fixed_margin: float | None = None,
    alpha: float = 1.0,
    beta: float = 8.0,
    gamma: float = 0.8,
    margin_max: float = 1.5,
    symmetric: bool = False,
    theta: str = "logit",
    margin_mode: str = "carried",
) -> SpecsLoss:
    """SPECS (Chen, Salazar, Kementchedjhieva, 2025, "SPECS: Specificity-Enhanced
    CLIP-Score for Long Image Caption Evaluation", section 3.3, eqs. 3–4).

    Inputs are (B, D): the image, the full caption (contrastive term), the base
    text c_j, c_j + d⁺ (a correct detail added) and c_j + d⁻ (a wrong detail added).
    With θ(x) on the matched pair:

      L_detail = mean relu(ε + θ(c_j) − θ(c_j + d⁺))      a correct detail must raise the score
      L_neg    = mean relu(ε + θ(c_j + d⁻) − θ(c_j))      a wrong detail must lower it
      L = α·L_contrastive + β·L_detail + γ·L_neg           (α, β, γ = 1, 8, 0.8; §4.3)

    Eq. 3 prints max(0, θ(i, c_j + d⁺) − θ(i, c_j) + ε), which would *penalise* a
    detail that raises the score; §3.3's prose ("rewards higher similarity scores for
    incrementally more informative captions") fixes the sign used here.

    Defaults = the SPECS reference code (its ``DetailLossCalculator``, "calculate the
    loss of SPEC"), which produced the published model; the printed equations are options:

    * ``theta="logit"`` (default, reference): θ = scale · cos(image, text), the logits.
      ``"cosine"``: θ = cos(image, text), as §3.2 defines θ ("θ is the cosine similarity").
    * ``margin_mode="carried"`` (default, reference): each hinge uses the current ε, then
      ε ← clamp(mean(θ_bigger − θ_smaller), 0, ``margin_max``), detached — updated after
      L_detail and again after L_neg, and carried to the next step (return value
      ``margin``). ``"per-batch"``: as printed, "ε is a batch-wise average similarity
      difference between detailed and base captions, which is detached ... and clamped":
      L_detail uses ε⁺ = clamp(mean(θ(c_j + d⁺) − θ(c_j))) of *this* batch, and L_neg,
      "computed by analogy", ε⁻ = clamp(mean(θ(c_j) − θ(c_j + d⁻))); clamp to
      [0, ``margin_max``] (the paper gives no bounds; these are the reference's).
    * ``fixed_margin``: a constant ε for both hinges (the reference switches to it
      when its ``epsilon`` option is non-zero; here only when set explicitly).
    ``symmetric=False`` (default) uses text -> image cross-entropy only, as the
    reference's ``clip_loss(logits_caption)`` does; ``True`` gives the symmetric CLIP loss.
    """
    if theta not in SPECS_THETAS:
        raise param_error("theta", "specs_loss", "'logit' (reference code) or 'cosine' (§3.2)", theta)
    if margin_mode not in SPECS_MARGINS:
        raise param_error("margin_mode", "specs_loss", "'carried' (reference code) or 'per-batch' (eq. 3)",
                          margin_mode)
    s = _as_scale(scale)
    img = _unit(image)

    def th(t):  # (B,) cosine on the matched pair, logit-scaled unless theta="cosine"
        cos = (img * _unit(t)).sum(-1)
        return cos if theta == "cosine" else s * cos

    th_base, th_det, th_neg = th(base), th(detail), th(negative)
    l_con = contrastive_loss(image, caption, s, symmetric=symmetric)
    if fixed_margin is not None:
        l_det = hinge(th_det, th_base, fixed_margin)
        l_neg = hinge(th_base, th_neg, fixed_margin)
        eps = float(fixed_margin)
    elif margin_mode == "per-batch":
        l_det = hinge(th_det, th_base, dynamic_margin(th_det, th_base, high=margin_max))
        eps = dynamic_margin(th_base, th_neg, high=margin_max)
        l_neg = hinge(th_base, th_neg, eps)
    else:
        l_det = hinge(th_det, th_base, margin)
        eps = dynamic_margin(th_det, th_base, high=margin_max)
        l_neg = hinge(th_base, th_neg, eps)
        eps = dynamic_margin(th_base, th_neg, high=margin_max)
    parts = (alpha * l_con, beta * l_det, gamma * l_neg)
    return SpecsLoss(parts[0] + parts[1] + parts[2], *parts, margin=eps)


# ----------------------------------------------------------------------------- PR-MCS
@dataclass(frozen=True)
class PrmcsLoss:
    loss: torch.Tensor
    clip: torch.Tensor
    align: torch.Tensor  # λ1 (1 − cos(V, T(o)))
    image_perturbed: torch.Tensor  # λ2 max(m, cos(V, T(p)))
    text_perturbed: torch.Tensor  # λ3 max(m, cos(T(o), T(p)))


def prmcs_loss(
    image: torch.Tensor,
    original: torch.Tensor,
    perturbed: torch.Tensor,
    scale,
    *,
    margin: float = 0.1,
    lambdas: tuple[float, float, float] = (0.1, 0.05, 0.05),
) -> PrmcsLoss:
    """PR-MCS fine-tuning (Kim et al., 2023, "PR-MCS: Perturbation Robust Metric for
    MultiLingual Image Captioning", section 3.4).

      L = L_CLIP(V(I), T(o)) + λ1·(1 − cos(V(I), T(o)))
          + λ2·max(m, cos(V(I), T(p))) + λ3·max(m, cos(T(o), T(p)))

    m = 0.1, (λ1, λ2, λ3) = (0.1, 0.05, 0.05). ``image`` and ``original`` are (B, D);
    ``perturbed`` is (B, D) or (B, K, D) for K perturbations per caption (the max
    terms are then averaged over all B·K pairs). Each term is a batch mean. The
    floor ``max(m, ·)`` stops pushing a perturbed caption away once its cosine is
    below m. Only the text tower should be trainable (the recipe freezes the image
    tower); this function does not enforce it.
    """
    v, o = _unit(image), _unit(original)
    p = _unit(perturbed)
    if p.ndim == 2:
        p = p[:, None, :]  # (B, 1, D)
    l1, l2, l3 = lambdas
    clip = contrastive_loss(image, original, scale)
    align = l1 * (1 - (v * o).sum(-1)).mean()
    img_p = l2 * torch.einsum("bd,bkd->bk", v, p).clamp(min=margin).mean()  # (B, K)
    txt_p = l3 * torch.einsum("bd,bkd->bk", o, p).clamp(min=margin).mean()
    return PrmcsLoss(clip + align + img_p + txt_p, clip, align, img_p, txt_p)


# ----------------------------------------------------------------------------- distillation
def distillation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Multilingual teacher distillation (Kim et al., 2023, section 3.1, after M-CLIP):
    the student embeds a translation, the teacher (the frozen CLIP text tower) the
    English caption, and L = MSE(student, teacher), averaged over all B·D elements
    (``torch.nn.MSELoss`` default, as in M-CLIP). The vectors are NOT normalised:
    the student learns the teacher's raw joint-space vector, so its norm too.
    """
    if student.shape != teacher.shape:
        raise param_error("student", "distillation_loss", f"shape {tuple(teacher.shape)}", tuple(student.shape))
    return F.mse_loss(student.float(), teacher.detach().float())


# ----------------------------------------------------------------------------- PAC-S
@dataclass(frozen=True)
class PacsLoss:
    loss: torch.Tensor
    real: torch.Tensor
    generated_images: torch.Tensor
    generated_texts: torch.Tensor


def pacs_loss(
    image: torch.Tensor,
    text: torch.Tensor,
    gen_image: torch.Tensor,
    gen_text: torch.Tensor,
    scale,
    *,
    lambda_v: float = 0.05,
    lambda_t: float = 0.05,
    directions: str = "sum",
) -> PacsLoss:
    """PAC-S (Sarto et al., CVPR 2023, "Positive-Augmented Contrastive Learning for
    Image and Video Captioning Evaluation", section 3; pac-s.txt, the poster's loss box):

      L = L(V, T) + λ_v·L(V′, T) + λ_t·L(V, T′)

      L(V, T) = −(1/N) Σ_i log[exp(cos(v_i, t_i)/τ) / Σ_j exp(cos(v_i, t_j)/τ)]
                −(1/N) Σ_i log[exp(cos(v_i, t_i)/τ) / Σ_j exp(cos(v_j, t_i)/τ)]

    i.e. the *sum* of the image->text and text->image cross-entropies, as printed
    (``directions="sum"``, the default); ``directions="mean"`` halves it, as CLIP's
    own loss (:func:`contrastive_loss`) does — the same three-term balance at half the
    scale (under AdamW without gradient clipping the two give nearly the same updates).
    1/τ is ``scale`` (the model's ``logit_scale.exp()``). V′ are images generated from
    the captions T (Stable Diffusion in the paper), T′ captions generated for the images
    V (BLIP); both are positives of their row, and the same InfoNCE is applied to them.

    λ_v and λ_t: pac-s.txt (the poster and the paper's opening) does not state their
    values, and pacscore publishes no training code, so λ_v = λ_t = 0.05 is capscore's
    default, unverified against the paper; both are parameters (``--set lambda_v=...``).
    """
    if directions not in ("sum", "mean"):
        raise param_error("directions", "pacs_loss", "'sum' or 'mean'", directions)
    factor = 2.0 if directions == "sum" else 1.0  # contrastive_loss is the mean of the two directions

    def infonce(v, t):
        return factor * contrastive_loss(v, t, scale)

    real = infonce(image, text)
    gv = lambda_v * infonce(gen_image, text)
    gt = lambda_t * infonce(image, gen_text)
    return PacsLoss(real + gv + gt, real, gv, gt)
