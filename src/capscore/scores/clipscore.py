"""The CLIPScore family: CLIP-S, RefCLIP-S, PAC-S, RefPAC-S, (PR-)MCS, and the plain cosine — pure functions.

CLIP-S (Hessel et al., 2021, eq. 1):   CLIP-S(c, v) = w · max(cos(c, v), 0),  w = 2.5
RefCLIP-S (eq. 2):                     H-mean(CLIP-S(c, v), max(max_r cos(c, r), 0))
PAC-S (Sarto et al., 2023):            the same with w = 2.0 and PAC-S fine-tuned weights
RefPAC-S:                              H-mean(PAC-S(c, v), max(max_r cos(c, r), 0))
MCS / PR-MCS (Kim et al., 2023):       CLIP-S with w = 2.5 computed with a multilingual
                                       text student and the CLIP image tower.
cosine (Radford et al., 2021):         cos(c, v), w = 1 and no clamp: the similarity CLIP is
                                       trained on and the probes rank by.

The clamp is applied to each pair, as in the reference code of clipscore and
pacscore (torchmetrics' docstring clamps per pair too, but its code clamps the
mean; we clamp per pair). The harmonic mean of two zeros is 0, not NaN.

Inputs are L2-normalised embeddings (the encoding engine returns them so).
The rows of the metric registry (:mod:`capscore.scores.metric`) for this family
are registered at the end of this module; on videos the same names use the
EMScore-style formulas of :mod:`capscore.scores.video`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError
from capscore.scores.metric import EmbeddingBatch, Metric, Values, register
from capscore.scores.video import VIDEO_METRICS

if TYPE_CHECKING:  # torch is imported where a formula runs: the registry's names are known without it
    import torch

CLIPSCORE_PREFIX = "A photo depicts "  # prepended to candidates and references by clipscore and pacscore


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of normalised (N, D) tensors -> (N,)."""
    return (a * b).sum(-1)


def clip_s(image: torch.Tensor, text: torch.Tensor, *, w: float = 2.5) -> torch.Tensor:
    """w · max(cos(image, text), 0), per row."""
    return w * cosine(image, text).clamp(min=0)


def ref_similarity(text: torch.Tensor, refs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max over valid references of cos(text, ref), clamped at 0.

    text (N, D); refs (N, R, D); mask (N, R) bool, True where a reference exists.
    """
    import torch  # noqa: PLC0415  (deferred: torch)

    sims = torch.einsum("nd,nrd->nr", text, refs).masked_fill(~mask, float("-inf"))
    best = sims.max(dim=1).values
    if (~mask).all(dim=1).any():
        raise CapscoreError("a reference-based metric needs at least one reference per caption")
    return best.clamp(min=0)


def harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """2ab / (a + b), defined as 0 where a + b = 0."""
    import torch  # noqa: PLC0415  (deferred: torch)

    s = a + b
    return torch.where(s > 0, 2 * a * b / s.where(s > 0, torch.ones_like(s)), torch.zeros_like(s))


def ref_clip_s(
    image: torch.Tensor, text: torch.Tensor, refs: torch.Tensor, mask: torch.Tensor, *, w: float = 2.5
) -> torch.Tensor:
    """H-mean(w · max(cos(image, text), 0), max(max_r cos(text, r), 0))."""
    return harmonic_mean(clip_s(image, text, w=w), ref_similarity(text, refs, mask))


@dataclass(frozen=True)
class GlobalCosine:
    """The formula of the family on images: ``w · max(cos(image, caption), 0)`` (eq. 1) — unclamped with
    ``clamp=False`` — and, with ``refs``, its harmonic mean with max(max_r cos(caption, r), 0) (eq. 2).

    The weight and the clamp are the metric's published constants (read through its registry row as
    ``Metric.w`` and ``Metric.clamp``); as a registry formula it reads normalised vectors from an
    :class:`~capscore.scores.metric.EmbeddingBatch`.
    """

    w: float = 1.0
    clamp: bool = True
    refs: bool = False

    @property
    def needs(self) -> frozenset:
        return frozenset({"global", "refs"} if self.refs else {"global"})

    @property
    def columns(self) -> tuple[str, ...]:
        return COMPONENTS if self.refs else ()

    def pair(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The image part per row: w · max(cos, 0) (w · cos unclamped)."""
        return clip_s(image, text, w=self.w) if self.clamp else self.w * cosine(image, text)

    def formula(self, image, text, refs=None, mask=None) -> torch.Tensor:
        if self.refs:
            return harmonic_mean(self.pair(image, text), ref_similarity(text, refs, mask))
        return self.pair(image, text)

    def components(self, image, text, refs, mask) -> dict[str, torch.Tensor]:
        """The parts a reference-based score is made of, as clipscore.py reports them:
        ``image_score`` = w·max(cos(image, text), 0) (the CLIP-S / PAC-S part) and
        ``ref_score`` = max(max_r cos(text, r), 0)."""
        return {"image_score": self.pair(image, text), "ref_score": ref_similarity(text, refs, mask)}

    def compute(self, batch: EmbeddingBatch) -> Values:
        img, txt = batch.images(), batch.texts()
        if not self.refs:
            return Values(self.formula(img, txt).tolist())
        parts = self.components(img, txt, *batch.refs())
        return Values(harmonic_mean(parts["image_score"], parts["ref_score"]).tolist(),
                      {k: v.tolist() for k, v in parts.items()})


COMPONENTS = ("image_score", "ref_score")  # extra row columns of RefCLIP-S / RefPAC-S (clipscore.py reports both)

_HESSEL = "Hessel et al., CLIPScore, EMNLP 2021"
_SARTO = "Sarto et al., PAC-S, CVPR 2023"


def _pac_weights(name: str):
    def check(spec: str, family: str) -> str | None:
        if "pac" in spec.lower():
            return None
        return (f"metric {name} uses w=2.0, calibrated for PAC-S weights; {spec} does not look like a PAC-S "
                "checkpoint ('pac' not in its name), so the scale is not PAC-S's")
    return check


def _mclip_weights(spec: str, family: str) -> str | None:
    if family == "mclip":
        return None
    return (f"metric mcs expects a multilingual backbone (mclip:DIR); {spec} is not one, so these are "
            "monolingual CLIP-S scores without the prefix")


# one row per name; a row scores images, videos or both (videos: capscore.scores.video, EMScore-style)
register(Metric("clip-s", _HESSEL, image=GlobalCosine(2.5), video=VIDEO_METRICS["clip-s"], prefix=CLIPSCORE_PREFIX,
                range=(0.0, 2.5), note="2.5 · max(cos(image, caption), 0); on a video: on the mean frame"))
register(Metric("refclip-s", _HESSEL, image=GlobalCosine(2.5, refs=True), prefix=CLIPSCORE_PREFIX,
                range=(0.0, 2.5), note="H-mean(CLIP-S, max(max_r cos(caption, r), 0))"))
register(Metric("pac-s", _SARTO + " (video: §4.3)", image=GlobalCosine(2.0), video=VIDEO_METRICS["pac-s"],
                prefix=CLIPSCORE_PREFIX, range=(0.0, 2.0), default_model="ckpt:PATH/clip_ViT-B-32.pth",
                weights_check=_pac_weights("pac-s"),
                note="2 · max(cos, 0) with PAC-S weights (--model ckpt:PATH/clip_ViT-B-32.pth); "
                     "on a video: (coarse + fine F)/2"))
register(Metric("refpac-s", _SARTO + " (video: §4.3)", image=GlobalCosine(2.0, refs=True),
                video=VIDEO_METRICS["refpac-s"], prefix=CLIPSCORE_PREFIX, range=(0.0, 2.0),
                default_model="ckpt:PATH/clip_ViT-B-32.pth", weights_check=_pac_weights("refpac-s"),
                note="H-mean(PAC-S, reference part) with PAC-S weights"))
register(Metric("mcs", "Kim et al., PR-MCS, 2023 (multilingual CLIPScore)", image=GlobalCosine(2.5), prefix="",
                range=(0.0, 2.5), default_model="mclip:DIR", weights_check=_mclip_weights,
                note="CLIP-S with a multilingual text student (--model mclip:DIR), no prefix"))
register(Metric("emscore", "Shi et al., EMScore, CVPR 2022", video=VIDEO_METRICS["emscore"], range=(-1.0, 1.0),
                note="EMScore(X, V) = (coarse + fine F)/2 with CLIP weights (videos)"))
register(Metric("emscore-ref", "Shi et al., EMScore, CVPR 2022", video=VIDEO_METRICS["emscore-ref"],
                range=(-1.0, 1.0), note="EMScore(X, V, X*): components maxed over references separately (videos)"))
register(Metric("cosine", "Radford et al., CLIP, ICML 2021 (cosine similarity of the joint embeddings)",
                image=GlobalCosine(1.0, clamp=False), prefix="", range=(-1.0, 1.0),
                note="cos(image, caption), unweighted and unclamped: the similarity the probes rank by"))
