"""The CLIPScore family: CLIP-S, RefCLIP-S, PAC-S, RefPAC-S, (PR-)MCS — pure functions.

CLIP-S (Hessel et al., 2021, eq. 1):   CLIP-S(c, v) = w · max(cos(c, v), 0),  w = 2.5
RefCLIP-S (eq. 2):                     H-mean(CLIP-S(c, v), max(max_r cos(c, r), 0))
PAC-S (Sarto et al., 2023):            the same with w = 2.0 and PAC-S fine-tuned weights
RefPAC-S:                              H-mean(PAC-S(c, v), max(max_r cos(c, r), 0))
MCS / PR-MCS (Kim et al., 2023):       CLIP-S with w = 2.5 computed with a multilingual
                                       text student and the CLIP image tower.

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
from capscore.scores.metric import EmbeddingBatch, Metric, Values, get_metric, register
from capscore.scores.video import VIDEO_METRICS

if TYPE_CHECKING:  # torch is imported where a formula runs: the registry's names are known without it
    import torch

CLIPSCORE_PREFIX = "A photo depicts "  # prepended to candidates and references by clipscore and pacscore


def resolve_prefix(metric: "str | Metric", prefix: str | None, medium: str = "image") -> str:
    """The prefix a run uses: ``prefix`` when given (``""`` = none), else the metric's own default.

    The one place every entry point (CLI, ``capscore.score``, the torchmetrics
    Metric, correlate) decides it, so they all score the same text.
    """
    if prefix is not None:
        if not isinstance(prefix, str):
            raise CapscoreError(f"prefix must be a string; got {type(prefix).__name__}")
        return prefix
    if isinstance(metric, MetricSpec):  # a bare formula
        return metric.default_prefix
    return get_metric(metric).default_prefix_for(medium)


def add_prefix(prefix: str, texts) -> list[str]:
    """``prefix + text`` for each text (candidates and references alike, as clipscore.py does)."""
    return [prefix + t for t in texts]


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
    import torch

    sims = torch.einsum("nd,nrd->nr", text, refs).masked_fill(~mask, float("-inf"))
    best = sims.max(dim=1).values
    if (~mask).all(dim=1).any():
        raise CapscoreError("a reference-based metric needs at least one reference per caption")
    return best.clamp(min=0)


def harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """2ab / (a + b), defined as 0 where a + b = 0."""
    import torch

    s = a + b
    return torch.where(s > 0, 2 * a * b / s.where(s > 0, torch.ones_like(s)), torch.zeros_like(s))


def ref_clip_s(
    image: torch.Tensor, text: torch.Tensor, refs: torch.Tensor, mask: torch.Tensor, *, w: float = 2.5
) -> torch.Tensor:
    """H-mean(w · max(cos(image, text), 0), max(max_r cos(text, r), 0))."""
    return harmonic_mean(clip_s(image, text, w=w), ref_similarity(text, refs, mask))


@dataclass(frozen=True)
class MetricSpec:
    """The CLIPScore-family formula on images: weight ``w``, reference-based or not.

    ``compute`` is eq. 1 (CLIP-S / PAC-S) or eq. 2 (RefCLIP-S / RefPAC-S) on
    normalised embeddings; as a registry formula it reads them from an
    :class:`~capscore.scores.metric.EmbeddingBatch`.
    """

    name: str
    w: float
    needs_refs: bool
    default_prefix: str
    citation: str
    note: str = ""

    needs = frozenset({"global"})

    @property
    def columns(self) -> tuple[str, ...]:
        return COMPONENTS if self.needs_refs else ()

    def formula(self, image, text, refs=None, mask=None) -> torch.Tensor:
        if self.needs_refs:
            return ref_clip_s(image, text, refs, mask, w=self.w)
        return clip_s(image, text, w=self.w)

    def components(self, image, text, refs=None, mask=None) -> dict[str, torch.Tensor]:
        """The parts a reference-based score is made of, as clipscore.py reports them:
        ``image_score`` = w·max(cos(image, text), 0) (the CLIP-S / PAC-S part) and
        ``ref_score`` = max(max_r cos(text, r), 0). Empty for reference-free metrics."""
        if not self.needs_refs:
            return {}
        return {"image_score": clip_s(image, text, w=self.w), "ref_score": ref_similarity(text, refs, mask)}

    def compute(self, batch: EmbeddingBatch) -> Values:
        img, txt = batch.images(), batch.texts()
        if not self.needs_refs:
            return Values(self.formula(img, txt).tolist())
        refs, mask = batch.refs()
        parts = {k: v.tolist() for k, v in self.components(img, txt, refs, mask).items()}
        return Values(self.formula(img, txt, refs, mask).tolist(), parts)


COMPONENTS = ("image_score", "ref_score")  # extra row columns of RefCLIP-S / RefPAC-S (clipscore.py reports both)

_HESSEL = "Hessel et al., CLIPScore, EMNLP 2021"
_SARTO = "Sarto et al., PAC-S, CVPR 2023"
_CLIP_S = MetricSpec("clip-s", 2.5, False, CLIPSCORE_PREFIX, _HESSEL)
_REFCLIP_S = MetricSpec("refclip-s", 2.5, True, CLIPSCORE_PREFIX, _HESSEL)
_PAC_S = MetricSpec("pac-s", 2.0, False, CLIPSCORE_PREFIX, _SARTO)
_REFPAC_S = MetricSpec("refpac-s", 2.0, True, CLIPSCORE_PREFIX, _SARTO)
_MCS = MetricSpec("mcs", 2.5, False, "", "Kim et al., PR-MCS, 2023 (multilingual CLIPScore)")

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
register(Metric("clip-s", _HESSEL, image=_CLIP_S, video=VIDEO_METRICS["clip-s"], prefix=CLIPSCORE_PREFIX,
                range=(0.0, 2.5), note="2.5 · max(cos(image, caption), 0); on a video: on the mean frame"))
register(Metric("refclip-s", _HESSEL, image=_REFCLIP_S, needs_refs=True, prefix=CLIPSCORE_PREFIX,
                range=(0.0, 2.5), note="H-mean(CLIP-S, max(max_r cos(caption, r), 0))"))
register(Metric("pac-s", _SARTO + " (video: §4.3)", image=_PAC_S, video=VIDEO_METRICS["pac-s"],
                prefix=CLIPSCORE_PREFIX, range=(0.0, 2.0), default_model="ckpt:PATH/clip_ViT-B-32.pth",
                weights_check=_pac_weights("pac-s"), note="2 · max(cos, 0) with PAC-S weights (--model ckpt:PATH/clip_ViT-B-32.pth); "
                     "on a video: (coarse + fine F)/2"))
register(Metric("refpac-s", _SARTO + " (video: §4.3)", image=_REFPAC_S, video=VIDEO_METRICS["refpac-s"],
                needs_refs=True, prefix=CLIPSCORE_PREFIX, range=(0.0, 2.0),
                default_model="ckpt:PATH/clip_ViT-B-32.pth", weights_check=_pac_weights("refpac-s"),
                note="H-mean(PAC-S, reference part) with PAC-S weights"))
register(Metric("mcs", _MCS.citation, image=_MCS, prefix="", range=(0.0, 2.5), default_model="mclip:DIR",
                weights_check=_mclip_weights, note="CLIP-S with a multilingual text student (--model mclip:DIR), no prefix"))
register(Metric("emscore", "Shi et al., EMScore, CVPR 2022", video=VIDEO_METRICS["emscore"], range=(-1.0, 1.0),
                note="EMScore(X, V) = (coarse + fine F)/2 with CLIP weights (videos)"))
register(Metric("emscore-ref", "Shi et al., EMScore, CVPR 2022", video=VIDEO_METRICS["emscore-ref"],
                needs_refs=True, range=(-1.0, 1.0),
                note="EMScore(X, V, X*): components maxed over references separately (videos)"))
