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
``hard_negative_contrastive_``  CLIP InfoNCE + one hard-negative caption per image as extra
``loss``                         image→text columns (the scenes-tiny recipe)
``filip_loss``                 FILIP token-wise max-similarity contrastive (Yao et al., 2021, 3.1)
=============================  =========================================================

Each objective computes in fp32, also inside the training loop's autocast (``capscore train --amp``):
only the towers run in bf16/fp16; the cosines, logits, maxima and losses do not (a bf16 logit at
scale 32 would be off by up to 0.125).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from capscore.errors import param_error


def _fp32(fn):
    """Run ``fn`` with autocast off for the device of its first tensor argument (inputs are cast by
    :func:`_unit` or ``.float()``), so an objective gives fp32 numbers under ``--amp`` too."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        t = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        with torch.autocast(t.device.type if t is not None else "cpu", enabled=False):
            return fn(*args, **kwargs)

    return run


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.float(), dim=-1)


def _as_scale(scale) -> torch.Tensor:
    return scale if isinstance(scale, torch.Tensor) else torch.tensor(float(scale))


# ----------------------------------------------------------------------------- CLIP
@_fp32
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


@_fp32
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


@_fp32
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
@_fp32
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


@_fp32
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


# ----------------------------------------------------------------------------- hard negatives
@_fp32
def hard_negative_contrastive_loss(
    image: torch.Tensor, text: torch.Tensor, negatives: torch.Tensor, scale
) -> tuple[torch.Tensor, dict]:
    """CLIP InfoNCE with hard-negative captions as extra image→text columns
    (the bundled scenes-tiny recipe; the negatives are NegCLIP-style controlled edits).

    image, text: (B, D); row i of ``text`` matches image i. negatives: (k·B, D), k ≥ 1 blocks of B
    rows: row j·B + i is image i's j-th false caption (k = 1: one hard negative per image).

      i2t = scale · cos(image, [text; negatives])     (B, (1+k)B)   every caption is a candidate
      t2i = scale · cos(text, image)                  (B, B)        negatives are not queries
      L = ½ [CE(i2t, arange B) + CE(t2i, arange B)]

    Returns (loss, {"i2t_acc", "hardneg_acc"}): batch image→text accuracy over all (1+k)B
    columns and the share of images whose positive beats every one of their own hard negatives.
    (The products are written as in capscore's first scenes trainer, so the bundled
    model's run is reproduced bit for bit; see tests/test_train_scenes_tiny.py.)
    """
    s = _as_scale(scale)
    img, pos, neg = _unit(image), _unit(text), _unit(negatives)
    target = torch.arange(img.shape[0], device=img.device)
    n = img.shape[0]
    if neg.shape[0] == 0 or neg.shape[0] % n:
        raise ValueError(f"negatives must be k x {n} rows (k >= 1 blocks, one row per image each), got {neg.shape[0]}")
    i2t = s * img @ torch.cat([pos, neg]).T  # (B, (1+k)B)
    t2i = s * pos @ img.T  # (B, B)
    loss = (F.cross_entropy(i2t, target) + F.cross_entropy(t2i, target)) / 2
    with torch.no_grad():
        own = (img[None] * neg.view(-1, n, neg.shape[1])).sum(2).amax(0)  # each image's best hard negative
        stats = {"i2t_acc": (i2t.argmax(1) == target).float().mean().item(),
                 "hardneg_acc": ((img * pos).sum(1) > own).float().mean().item()}
    return loss, stats


# ----------------------------------------------------------------------------- FILIP
@_fp32
def filip_similarity(
    image_tokens: torch.Tensor, text_tokens: torch.Tensor, text_mask: torch.Tensor,
    image_mask: torch.Tensor | None = None, *, text_group: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FILIP's token-wise maximum similarity (Yao et al., 2021, "FILIP: Fine-grained
    Interactive Language-Image Pre-Training", ICLR 2022, section 3.1,
    "cross-modal late interaction").

    image_tokens (Bi, N, D) patch tokens; text_tokens (Bt, L, D) token features, both in
    the joint space (normalised here); text_mask (Bt, L) True on real tokens (padding is
    excluded, as in the paper: "the number of non-padded tokens"); image_mask (Bi, N)
    optional (FILIP drops image patches only for speed; all patches count by default).
    With c[i, j, k, r] = cos(patch k of image i, token r of text j):

      s_i2t[i, j] = mean_k  max_r c[i, j, k, r]    image→text: each patch's best token
      s_t2i[i, j] = mean_r  max_k c[i, j, k, r]    text→image: each token's best patch

    Returns (s_i2t, s_t2i), both (Bi, Bt). Open choices: the start/end tokens count as
    tokens (the paper's "non-padded tokens" includes them); the class token is not a patch.
    """
    x = _unit(image_tokens)
    y = _unit(text_tokens)
    tm = text_mask.to(torch.bool)
    im = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if image_mask is None else image_mask.to(torch.bool)
    # Texts in length-sorted groups, each trimmed to its own longest: the cost follows the real
    # token count, not the batch's longest caption (padding never wins a max: it is masked).
    lengths = tm.sum(1)
    order = torch.argsort(lengths, stable=True)
    parts_i2t, parts_t2i = [], []
    for idx in order.split(text_group):
        n = max(1, int(lengths[idx].max()))
        a, b = _TokenWiseMax.apply(x, y[idx, :n], tm[idx, :n], im)
        parts_i2t.append(a)
        parts_t2i.append(b)
    back = torch.argsort(order)
    return torch.cat(parts_i2t, 1)[:, back], torch.cat(parts_t2i, 1)[:, back]


@_fp32
def filip_pair_similarity(
    image_tokens: torch.Tensor, text_tokens: torch.Tensor, text_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`filip_similarity` of image i with text i only: (s_i2t[i, i], s_t2i[i, i]), both (B,)."""
    x = _unit(image_tokens)
    y = _unit(text_tokens)
    tm = text_mask.to(torch.bool)
    c = torch.einsum("ind,ild->inl", x, y)  # (B, N, L)
    s_i2t = c.masked_fill(~tm[:, None, :], torch.finfo(c.dtype).min).amax(2).mean(1)
    s_t2i = (c.amax(1) * tm).sum(1) / tm.sum(1).clamp(min=1)
    return s_i2t, s_t2i


class _TokenWiseMax(torch.autograd.Function):
    """The two token-wise max similarities of :func:`filip_similarity` without autograd's
    full-size intermediates: the (Bi, Bt, N, L) cosine tensor is formed a block of images at a
    time and only the arg-maxes are kept (int64, (Bi, Bt, N) and (Bi, Bt, L)); the backward pass
    scatters the incoming gradients onto those arg-maxes block by block and multiplies back. The
    gradient is the one autograd gives through ``amax`` except at exact ties (autograd splits a
    tie evenly, this picks one), which have probability zero for float features
    (``tests/test_train_scenes_tiny.py`` checks values and gradients against plain autograd).
    Why: autograd through ``amax`` keeps the whole cosine tensor for the backward pass; keeping only the
    arg-maxes makes the FILIP term much cheaper in memory and time (docs/research/docstring-figures.md)."""

    BLOCK_ELEMENTS = 1 << 24  # cosines per block (64 MB fp32)

    @staticmethod
    def _blocks(x, y):
        bi, n = x.shape[:2]
        bt, length = y.shape[:2]
        step = max(1, _TokenWiseMax.BLOCK_ELEMENTS // max(1, bt * n * length))
        return [(a, min(a + step, bi)) for a in range(0, bi, step)]

    @staticmethod
    def forward(ctx, x, y, tm, im):
        neg_inf = torch.finfo(x.dtype).min
        (bi, n, d), (bt, length) = x.shape, y.shape[:2]
        n_img = im.sum(1).clamp(min=1).to(x.dtype)  # (Bi,)
        n_txt = tm.sum(1).clamp(min=1).to(x.dtype)  # (Bt,)
        yt = y.reshape(bt * length, d).T
        s_i2t, s_t2i = x.new_empty(bi, bt), x.new_empty(bi, bt)
        arg_token = torch.empty(bi, n, bt, dtype=torch.long, device=x.device)
        arg_patch = torch.empty(bi, bt, length, dtype=torch.long, device=x.device)
        for a, b in _TokenWiseMax._blocks(x, y):
            c = (x[a:b].reshape(-1, d) @ yt).view(b - a, n, bt, length)  # one GEMM: c[i, k, j, r]
            c.masked_fill_(~tm[None, None], neg_inf)
            best_token, arg_token[a:b] = c.max(dim=3)  # (bi, N, Bt)
            s_i2t[a:b] = (best_token * im[a:b, :, None]).sum(1) / n_img[a:b, None]
            c.masked_fill_(~im[a:b, :, None, None], neg_inf)
            best_patch, arg_patch[a:b] = c.max(dim=1)  # (bi, Bt, L)
            s_t2i[a:b] = best_patch.masked_fill(~tm[None], 0).sum(2) / n_txt[None]
        ctx.save_for_backward(x, y, tm, im, arg_token, arg_patch)
        return s_i2t, s_t2i

    @staticmethod
    def backward(ctx, g_i2t, g_t2i):
        x, y, tm, im, arg_token, arg_patch = ctx.saved_tensors
        (_, n, d), (bt, length) = x.shape, y.shape[:2]
        n_img = im.sum(1).clamp(min=1).to(x.dtype)
        n_txt = tm.sum(1).clamp(min=1).to(x.dtype)
        yf = y.reshape(bt * length, d)
        dx, dy = torch.zeros_like(x), torch.zeros(bt * length, d, dtype=y.dtype, device=y.device)
        for a, b in _TokenWiseMax._blocks(x, y):
            g = x.new_zeros(b - a, n, bt, length)  # d loss / d c[i, k, j, r], one block of images
            if g_i2t is not None:  # each kept patch k: weight g/n_img on its best token
                w = g_i2t[a:b, None, :] * im[a:b, :, None] / n_img[a:b, None, None]  # (bi, N, Bt)
                g.scatter_add_(3, arg_token[a:b, :, :, None], w[..., None])
            if g_t2i is not None:  # each real token r: weight g/n_txt on its best patch
                w = g_t2i[a:b, :, None] * tm[None] / n_txt[None, :, None]  # (bi, Bt, L)
                g.scatter_add_(1, arg_patch[a:b, None], w[:, None])
            g = g.view(-1, bt * length)
            dx[a:b] = (g @ yf).view(b - a, n, d)
            dy += g.T @ x[a:b].reshape(-1, d)
        return dx, dy.view_as(y), None, None


@_fp32
def filip_loss(
    image_tokens: torch.Tensor, text_tokens: torch.Tensor, text_mask: torch.Tensor, scale,
    *, negative_columns: str = "all",
) -> torch.Tensor:
    """FILIP's contrastive loss (Yao et al., 2021, section 3.1: the CLIP InfoNCE with the
    token-wise similarities of :func:`filip_similarity`): image i's query over the texts uses s_i2t, text j's query
    over the images uses s_t2i. Texts beyond the first Bi rows (e.g. hard negatives) are
    extra image→text columns only, as in :func:`hard_negative_contrastive_loss`:
    ``negative_columns="all"`` gives every image every extra text as a column; ``"own"`` (needs
    (1+k)·Bi texts, k ≥ 1 blocks of Bi negatives) gives image i only its own hard negatives (texts
    j·Bi + i for j = 1..k) — capscore's cost-saving choice for training, with k = 1 half the token-wise
    products (FILIP has no hard negatives).

      L = ½ [CE(scale · s_i2t, arange Bi) + CE(scale · s_t2iᵀ[:Bi], arange Bi)]

    ``scale`` is the model's logit scale (FILIP learns one temperature; capscore shares
    CLIP's, so the global and the dense term see the same one).
    """
    s = _as_scale(scale)
    n = image_tokens.shape[0]
    target = torch.arange(n, device=image_tokens.device)
    if negative_columns == "all":
        s_i2t, s_t2i = filip_similarity(image_tokens, text_tokens, text_mask)
    elif negative_columns == "own":
        if text_tokens.shape[0] < 2 * n or text_tokens.shape[0] % n:
            raise ValueError(f"negative_columns='own' needs (1+k) x {n} texts (positives, then k >= 1 blocks of "
                             f"one negative per image), got {text_tokens.shape[0]}")
        s_i2t, s_t2i = filip_similarity(image_tokens, text_tokens[:n], text_mask[:n])
        own = [filip_pair_similarity(image_tokens, text_tokens[a:a + n], text_mask[a:a + n])[0][:, None]
               for a in range(n, text_tokens.shape[0], n)]
        s_i2t = torch.cat([s_i2t, *own], 1)
    else:
        raise ValueError(f"negative_columns must be 'all' or 'own', not {negative_columns!r}")
    return 0.5 * (F.cross_entropy(s * s_i2t, target) + F.cross_entropy(s * s_t2i[:, :n].T, target))
