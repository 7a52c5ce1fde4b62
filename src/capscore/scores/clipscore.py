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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from capscore.errors import CapscoreError, unknown_name

CLIPSCORE_PREFIX = "A photo depicts "  # prepended to candidates and references by clipscore and pacscore
PAIR_SCORER_PREFIX = {"abe": ""}  # ABE-CLIP scores captions as written (docs/abe.md)


def resolve_prefix(metric: "str | MetricSpec", prefix: str | None) -> str:
    """The prefix a run uses: ``prefix`` when given (``""`` = none), else the metric's own default.

    The one place every entry point (CLI, ``capscore.score``, the torchmetrics
    Metric, correlate) decides it, so they all score the same text.
    """
    if prefix is not None:
        if not isinstance(prefix, str):
            raise CapscoreError(f"prefix must be a string; got {type(prefix).__name__}")
        return prefix
    name = metric if isinstance(metric, str) else metric.name
    if name in PAIR_SCORER_PREFIX:
        return PAIR_SCORER_PREFIX[name]
    return (get_metric(name) if isinstance(metric, str) else metric).default_prefix


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
    sims = torch.einsum("nd,nrd->nr", text, refs).masked_fill(~mask, float("-inf"))
    best = sims.max(dim=1).values
    if (~mask).all(dim=1).any():
        raise CapscoreError("a reference-based metric needs at least one reference per caption")
    return best.clamp(min=0)


def harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """2ab / (a + b), defined as 0 where a + b = 0."""
    s = a + b
    return torch.where(s > 0, 2 * a * b / s.where(s > 0, torch.ones_like(s)), torch.zeros_like(s))


def ref_clip_s(
    image: torch.Tensor, text: torch.Tensor, refs: torch.Tensor, mask: torch.Tensor, *, w: float = 2.5
) -> torch.Tensor:
    """H-mean(w · max(cos(image, text), 0), max(max_r cos(text, r), 0))."""
    return harmonic_mean(clip_s(image, text, w=w), ref_similarity(text, refs, mask))


@dataclass(frozen=True)
class MetricSpec:
    """A metric of the CLIPScore family: its weight, whether it needs references, its default prefix."""

    name: str
    w: float
    needs_refs: bool
    default_prefix: str
    citation: str
    note: str = ""

    def compute(self, image, text, refs=None, mask=None) -> torch.Tensor:
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


METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in [
        MetricSpec("clip-s", 2.5, False, CLIPSCORE_PREFIX, "Hessel et al., CLIPScore, EMNLP 2021"),
        MetricSpec("refclip-s", 2.5, True, CLIPSCORE_PREFIX, "Hessel et al., CLIPScore, EMNLP 2021"),
        MetricSpec("pac-s", 2.0, False, CLIPSCORE_PREFIX, "Sarto et al., PAC-S, CVPR 2023",
                   "use with PAC-S weights: --model ckpt:PATH/clip_ViT-B-32.pth"),
        MetricSpec("refpac-s", 2.0, True, CLIPSCORE_PREFIX, "Sarto et al., PAC-S, CVPR 2023"),
        MetricSpec("mcs", 2.5, False, "", "Kim et al., PR-MCS, 2023 (multilingual CLIPScore)",
                   "use with a multilingual backbone: --model mclip:DIR"),
    ]
}


def get_metric(name: str) -> MetricSpec:
    if name not in METRICS:
        raise unknown_name("metric", name, METRICS)
    return METRICS[name]
