"""DENEB (Matsuda, Wada, Sugiura, ACCV 2024): a hallucination-robust learned metric trained on Nebula.

Paper: "DENEB: A Hallucination-Robust Automatic Evaluation Metric for Image Captioning", arXiv:2409.19255,
§3 (Sim-Vec extraction and the Sim-Vec Transformer, which reads an image, a candidate and all its
references at once). Its text is not in ``shared/papers``; every formula below is read from the authors'
code, Ka2ukiMatsuda/DENEB at commit 0dfea82 (``DenebEstimator``, ``PositionalEncoding``) and its
training config (``configs/xlmr/base/da-estimator-cvpr.yaml``: ``layer: mix``, ``pool: cls``,
``hidden_sizes: 1536, 768``, ``activations: Tanh``, ``final_activation: False``).

Inputs (the text side is Polos': :func:`capscore.scores.polos.mix_layers` on SimCSE-RoBERTa; the CLIP is
PAC-S' fine-tuned open_clip ViT-L/14, raw projections, texts prefixed ``"In the image, "``, images
normalised with mean = std = 0.5 as open_clip's ``laion2b_s32b_b82k`` transform does). With ``U``, ``U₂``
the two learned D×D "upsamplers" (D = the RoBERTa width, equal to the CLIP width)::

    sim(a, b)  = [U(|a - b|), U(a ⊙ b)]              CLIP Sim-Vecs (2D)
    sim₂(a, b) = [U₂(|a - b|), U₂(a ⊙ b)]            RoBERTa Sim-Vecs (2D)
    X₁ = [cls₁, sim(v, c_v), sim(r_v1, c_v), …, sim(r_vR, c_v)] + PE     →  T₁ (3 post-norm layers)
    X₂ = [cls₂, sim₂(c_s, r_s1), …, sim₂(c_s, r_sR)] + PE               →  T₂ (3 post-norm layers)
    DENEB = σ(MLP([T₁(X₁)₀, T₂(X₂)₀, sim(v, c_v)]))  MLP: 6D → 1536 → 768 → 1, Tanh

``PE`` is the sinusoidal table stored in the checkpoint (``pos_encoder.pe``), added to the token sequence
(class token first); each layer is ``torch.nn.TransformerEncoderLayer(d_model=2D, nhead=8)`` with its
defaults (feed-forward 2048, ReLU, LayerNorm ε 1e-5, post-norm), written out in :func:`encoder_layer`.

Choices, exposed as parameters: ``layer_norm`` as in Polos (``"sentence"`` default; ``"batch"`` = one
call is one authors' batch, references truncated to the fewest of the batch). With ``"sentence"``, an
item uses all its own references: a batch of items with different numbers of references is padded and
the padding masked out of attention, so each score equals the item scored alone. No item may have more
references than the positional table has rows minus two.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from capscore.backbones.released import Part, WeightsFile, find_weights, numbered, shape_of, take
from capscore.backbones.sentence import SentenceEncoder, load_sentence_encoder
from capscore.errors import CapscoreError
from capscore.scores.polos import (
    SIMCSE, Features, ScalarMix, activation, extract, hidden_sizes, linears, mix_layers, mix_part, mlp,
    mlp_part, open_checkpoint, reference_vectors, run_head, scalar_mix,
)
from capscore.backbones.openai_ckpt import backbone_from_state_dict

from capscore.scores.citations import DENEB_CITATION as CITATION  # noqa: E402
CLIP_PREFIX = "In the image, "  # DenebEstimator.forward, for candidates and references alike
CLIP_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # open_clip ViT-L-14 laion2b_s32b_b82k's transform
HEADS = 8  # TransformerEncoderLayer(nhead=8)
LAYER_NORM_EPS = 1e-5  # torch.nn.TransformerEncoderLayer's default

CHECKPOINT = WeightsFile(
    ("deneb/deneb.ckpt", "deneb/deneb.safetensors"),
    "no public release is linked from github.com/Ka2ukiMatsuda/DENEB (commit 0dfea82); the checkpoint its "
    "train.sh writes (a Lightning .ckpt, with hparams.yaml beside it)",
    "the DENEB checkpoint")
__all__ = ["CHECKPOINT", "CITATION", "CLIP_PREFIX", "DenebHead", "DenebModel", "deneb_head", "encoder_layer",
           "load_deneb", "read_deneb", "score_deneb", "SIMCSE"]


@dataclass(frozen=True)
class EncoderLayer:
    """One ``TransformerEncoderLayer``'s tensors (names as in its state dict)."""

    in_proj_weight: torch.Tensor
    in_proj_bias: torch.Tensor
    out_proj_weight: torch.Tensor
    out_proj_bias: torch.Tensor
    linear1_weight: torch.Tensor
    linear1_bias: torch.Tensor
    linear2_weight: torch.Tensor
    linear2_bias: torch.Tensor
    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor


@dataclass(frozen=True)
class DenebHead:
    """The trained part of DENEB."""

    mix: ScalarMix
    upsampler: tuple[torch.Tensor, torch.Tensor]  # U: (W, b) applied to CLIP Sim-Vecs
    upsampler2: tuple[torch.Tensor, torch.Tensor]  # U₂: applied to RoBERTa Sim-Vecs
    cls1: torch.Tensor  # (2D,)
    cls2: torch.Tensor
    pe1: torch.Tensor  # (rows, 2D) positional table of T₁
    pe2: torch.Tensor
    layers1: tuple[EncoderLayer, ...]
    layers2: tuple[EncoderLayer, ...]
    linears: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    activation: str = "tanh"
    final_activation: str | None = None


# ------------------------------------------------------------------------------------ the head
def encoder_layer(x: torch.Tensor, p: EncoderLayer, *, heads: int = HEADS,
                  pad: torch.Tensor | None = None) -> torch.Tensor:
    """``TransformerEncoderLayer`` (post-norm, ReLU, eval): x (B, T, C); ``pad`` (B, T) True = padding key."""
    b, t, c = x.shape
    dh = c // heads
    q, k, v = (x @ p.in_proj_weight.T + p.in_proj_bias).split(c, dim=-1)
    q, k, v = (z.reshape(b, t, heads, dh).transpose(1, 2) for z in (q, k, v))  # (B, h, T, dh)
    logits = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (B, h, T, T)
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], -math.inf)
    y = (torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
    x = F.layer_norm(x + y @ p.out_proj_weight.T + p.out_proj_bias, (c,), p.norm1_weight, p.norm1_bias, LAYER_NORM_EPS)
    y = torch.relu(x @ p.linear1_weight.T + p.linear1_bias) @ p.linear2_weight.T + p.linear2_bias
    return F.layer_norm(x + y, (c,), p.norm2_weight, p.norm2_bias, LAYER_NORM_EPS)


def _sim(a: torch.Tensor, b: torch.Tensor, up: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    w, bias = up
    return torch.cat([(a - b).abs() @ w.T + bias, (a * b) @ w.T + bias], dim=-1)


def _transformer(tokens: torch.Tensor, mask: torch.Tensor, cls: torch.Tensor, pe: torch.Tensor,
                 layers: Sequence[EncoderLayer]) -> torch.Tensor:
    """CLS output of [cls, tokens…] + PE through ``layers``; ``mask`` (B, T) True = a real token."""
    b, t, _ = tokens.shape
    if t + 1 > pe.shape[0]:
        raise CapscoreError(f"DENEB reads at most {pe.shape[0] - 1} tokens (its positional table); got {t + 1}")
    x = torch.cat([cls.expand(b, 1, -1), tokens], dim=1) + pe[: t + 1]
    pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool), ~mask], dim=1)
    for layer in layers:
        x = encoder_layer(x, layer, pad=pad if bool(pad.any()) else None)
    return x[:, 0]


def deneb_head(feats: Features, head: DenebHead, *, layer_norm: str = "sentence") -> torch.Tensor:
    """DENEB scores (N,) from extracted features (module docstring); NaN for an item without references."""
    c_s = mix_layers(feats.cand, head.mix, layer_norm=layer_norm)  # (N, D)
    r_s, mask = reference_vectors(feats, head.mix, layer_norm=layer_norm)  # (N, R, D)
    n, r = mask.shape
    c_v = feats.cand_clip
    r_v = feats.ref_clip[feats.ref_index[:, :r].clamp_min(0)]  # (N, R, D)
    x3 = _sim(feats.image, c_v, head.upsampler)  # (N, 2D)
    x1 = torch.cat([x3[:, None], _sim(r_v, c_v[:, None], head.upsampler)], dim=1)  # (N, 1 + R, 2D)
    m1 = torch.cat([torch.ones(n, 1, dtype=torch.bool), mask], dim=1)
    x2 = _sim(c_s[:, None], r_s, head.upsampler2)  # (N, R, 2D); |c - r| = |r - c|
    t1 = _transformer(x1, m1, head.cls1, head.pe1, head.layers1)
    t2 = _transformer(x2, mask, head.cls2, head.pe2, head.layers2)
    s = torch.sigmoid(mlp(torch.cat([t1, t2, x3], dim=-1), head.linears, head.activation,
                          head.final_activation)).squeeze(-1)
    return torch.where(mask.any(1), s, torch.full_like(s, math.nan))


# ------------------------------------------------------------------------------------ the checkpoint
LAYER_KEYS = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
              "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
              "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")


def _layer_shapes(c: int, ff: int) -> dict[str, tuple[int, ...]]:
    shapes = [(3 * c, c), (3 * c,), (c, c), (c,), (ff, c), (ff,), (c, ff), (c,), (c,), (c,), (c,), (c,)]
    return dict(zip(LAYER_KEYS, shapes))


def _transformer_part(prefix: str, sd: Mapping[str, torch.Tensor], c: int, *, where: str) -> tuple[Part, int]:
    sub = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    n = numbered(sub, "layers")
    if n == 0:
        raise CapscoreError(f"{where}: no tensors under {prefix + 'layers.0.'!r}")
    ff = shape_of(sd, f"{prefix}layers.0.linear1.weight", where=where)[0]
    shapes = {f"layers.{i}.{k}": s for i in range(n) for k, s in _layer_shapes(c, ff).items()}
    return Part(prefix, shapes), n


def _layers(part: Mapping[str, torch.Tensor], n: int) -> tuple[EncoderLayer, ...]:
    return tuple(EncoderLayer(*(part[f"layers.{i}.{k}"].float() for k in LAYER_KEYS)) for i in range(n))


def read_deneb(path: str | Path) -> tuple[DenebHead, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(head, sentence-encoder tensors, CLIP tensors) of a DENEB checkpoint, its layout checked strictly.

    Layout (``DenebEstimator`` state dict): ``encoder.model.*`` (RoBERTa), ``scalar_mix.*``,
    ``ff.0.ff.linear_{1,2,3}.*`` (6D → 1536 → 768 → 1), ``transformer.layers.{0,1,2}.*`` and
    ``transformer2.layers.*`` (d_model 2D), ``upsampler.*`` / ``upsampler2.*`` (D × D),
    ``pos_encoder.pe`` / ``pos_encoder2.pe`` (1000, 1, 2D), ``cls_token1`` / ``cls_token2`` (1, 1, 2D),
    ``pacs_clip.*`` (PAC-S open_clip ViT-L/14)."""
    where = str(path)
    sd, hparams, n_layers, d, e = open_checkpoint(path, clip_prefix="pacs_clip.", metric="DENEB")
    if e != d:
        raise CapscoreError(f"{where}: the CLIP width ({e}) differs from the sentence encoder's ({d}); DENEB's "
                            "shared upsampler needs them equal")
    rows = shape_of(sd, "pos_encoder.pe", where=where)[0]
    t1, n1 = _transformer_part("transformer.", sd, 2 * d, where=where)
    t2, n2 = _transformer_part("transformer2.", sd, 2 * d, where=where)
    small = {"upsampler.weight": (d, d), "upsampler.bias": (d,), "upsampler2.weight": (d, d), "upsampler2.bias": (d,),
             "pos_encoder.pe": (rows, 1, 2 * d), "pos_encoder2.pe": (rows, 1, 2 * d),
             "cls_token1": (1, 1, 2 * d), "cls_token2": (1, 1, 2 * d)}
    parts = take(sd, {
        "encoder": Part("encoder.model.", open=True), "clip": Part("pacs_clip.", open=True),
        "mix": mix_part(n_layers), "ff": mlp_part("ff.0.ff.", sd, 6 * d, hidden_sizes(hparams), where=where),
        "t1": t1, "t2": t2,
        **{name: Part(name, {"": shape}) for name, shape in small.items()},
    }, where=where)
    head = DenebHead(
        mix=scalar_mix(parts["mix"], n_layers),
        upsampler=(parts["upsampler.weight"][""].float(), parts["upsampler.bias"][""].float()),
        upsampler2=(parts["upsampler2.weight"][""].float(), parts["upsampler2.bias"][""].float()),
        cls1=parts["cls_token1"][""].reshape(-1).float(), cls2=parts["cls_token2"][""].reshape(-1).float(),
        pe1=parts["pos_encoder.pe"][""][:, 0].float(), pe2=parts["pos_encoder2.pe"][""][:, 0].float(),
        layers1=_layers(parts["t1"], n1), layers2=_layers(parts["t2"], n2),
        linears=linears(parts["ff"]),
        activation=activation(hparams, "activations", "Tanh", where) or "tanh",
        final_activation=activation(hparams, "final_activation", None, where))
    return head, parts["encoder"], parts["clip"]


@dataclass
class DenebModel:
    head: DenebHead
    sentence: SentenceEncoder
    clip: object  # capscore.backbones.base.Backbone
    source: str = ""


def load_deneb(weights_dir: str | Path | None, *, device: str = "cpu", dtype: str = "fp32", clip=None,
               clip_arch: str | None = "ViT-L-14", checkpoint: str | Path | None = None) -> DenebModel:
    """DENEB from ``--metric-weights DIR`` (:data:`CHECKPOINT`, and the SimCSE folder of Polos).

    ``clip_arch``: the open_clip architecture the checkpoint's ``pacs_clip.*`` tower is loaded into
    (``ViT-L-14``: GELU, as DENEB builds it; inferring it from shapes would give OpenAI's QuickGELU).
    ``clip``: a capscore backbone to use instead (same weights and transform, shared encoding)."""
    path = Path(checkpoint) if checkpoint else find_weights(weights_dir, CHECKPOINT, metric="deneb")
    head, enc_sd, clip_sd = read_deneb(path)
    folder = find_weights(weights_dir if weights_dir is not None else path.parent.parent, SIMCSE, metric="deneb")
    sentence = load_sentence_encoder(enc_sd, folder, where=str(path), device=device, dtype=dtype)
    if clip is None:
        clip = backbone_from_state_dict(clip_sd, spec=f"deneb:{path}#pacs_clip", where=f"{path} (pacs_clip.*)",
                                        arch=clip_arch, mean_std=CLIP_MEAN_STD).to(device, dtype)
        clip.remember_weights_files([path], f"deneb-clip|{clip_arch}|{dtype}")  # its hash read once per file
    return DenebModel(head, sentence, clip, str(path))


def score_deneb(model: DenebModel, images: Sequence, captions: Sequence[str], refs: Sequence[Sequence[str]], *,
                layer_norm: str = "sentence", batch_size: int = 32, encode_batch_size: int = 64,
                clip=None, sentence=None) -> list[float]:
    """DENEB for each (image, caption, references) item: features once for all items (each distinct image
    and text once, encoders in batches of ``encode_batch_size``), then the head (in groups of
    ``batch_size`` for ``layer_norm="batch"``: the authors' batch). ``clip``, ``sentence``: as for
    :func:`capscore.scores.polos.score_polos`."""
    feats = extract(model.sentence if sentence is None else sentence, model.clip if clip is None else clip, images,
                    captions, refs, clip_prefix=CLIP_PREFIX, batch_size=encode_batch_size)
    return run_head(lambda f, layer_norm: deneb_head(f, model.head, layer_norm=layer_norm), feats,
                    layer_norm=layer_norm, batch_size=batch_size)
