"""Pair scorers: the one protocol through which probes, suites and meta-evaluation score.

A pair scorer takes an :class:`~capscore.embed.Encoder` and aligned sequences
of images and texts and returns one float per (image, text) pair, higher =
better match. Global cosine is the default; ABE-CLIP (``capscore.scores.abe``)
and the reference-free CLIPScore-family metrics (``clip-s``, ``pac-s``, ``mcs``, by
their :class:`~capscore.scores.clipscore.MetricSpec`) provide others. Probes never see models, only
a scorer and an encoder, so one encoding pass (and its cache) serves them all.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError, unknown_name

PairScorer = Callable[[Encoder, Sequence, Sequence[str]], torch.Tensor]


def cosine_pairs(encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
    """cos(image_i, text_i) for each i (unclamped, unweighted)."""
    img = encoder.encode_images(images)
    txt = encoder.encode_texts(texts)
    return (img * txt).sum(-1)


def text_text_cosine(encoder: Encoder, a: Sequence[str], b: Sequence[str]) -> torch.Tensor:
    """cos(a_i, b_i) between texts (for text-only probes such as SugarCrepe++ TOT or LGIP)."""
    return (encoder.encode_texts(a) * encoder.encode_texts(b)).sum(-1)


@dataclass(frozen=True)
class MetricPairScorer:
    """A reference-free CLIPScore-family metric (``clip-s``, ``pac-s``, ``mcs``) as a pair scorer.

    Scores ``spec.compute(image, prefix + text)`` per pair, e.g. MCS = 2.5 · max(0, cos)
    (PR-MCS §3.1). The prefix is applied here, to every text the probe scores.
    """

    spec: object  # capscore.scores.clipscore.MetricSpec
    prefix: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
        img = encoder.encode_images(images)
        txt = encoder.encode_texts([self.prefix + t for t in texts])
        return self.spec.compute(img, txt)


@dataclass(frozen=True)
class _Prefixed:
    """Another pair scorer applied to ``prefix + text`` (a prefix given to ``cosine`` or ``abe``)."""

    inner: Callable
    prefix: str
    name: str

    def __call__(self, encoder: Encoder, images: Sequence, texts: Sequence[str]) -> torch.Tensor:
        return self.inner(encoder, images, [self.prefix + t for t in texts])


def pair_scorer_names() -> list[str]:
    """Every name :func:`get_pair_scorer` accepts: cosine, abe and the reference-free registered metrics."""
    from capscore.scores.clipscore import METRICS

    return ["cosine", "abe"] + [m for m, spec in METRICS.items()
                                if m not in ("cosine", "abe") and not getattr(spec, "needs_refs", False)]


def get_pair_scorer(name: str, *, prefix: str | None = None, **options) -> PairScorer:
    """The pair scorer called ``name``.

    ``cosine`` (global CLIP similarity), ``abe`` (ABE-CLIP; ``options`` go to its config) or
    a reference-free metric of :mod:`capscore.scores.clipscore` (``clip-s``, ``pac-s``,
    ``mcs``): each pair scores as the metric's formula. ``prefix``: ``None`` gives the
    scorer's own (:func:`~capscore.scores.clipscore.resolve_prefix`: "A photo depicts "
    for clip-s and pac-s, none for mcs and abe, none for cosine); ``""`` none. The scorer
    prepends it itself, so callers pass captions as written. Reference-based metrics
    (refclip-s, refpac-s) have no pair form: a probe scores (image, text) pairs only.
    """
    from capscore.scores.clipscore import METRICS, get_metric, resolve_prefix

    if name not in ("cosine", "abe") and options:
        raise CapscoreError(f"options {sorted(options)} apply to the abe scorer only; got scorer {name!r}")
    if name == "cosine":
        return cosine_pairs if not prefix else _Prefixed(cosine_pairs, prefix, "cosine")
    if name == "abe":
        from capscore.scores.abe import make_abe_scorer  # provided by the ABE-CLIP module

        abe = make_abe_scorer(**options)
        return abe if not prefix else _Prefixed(abe, prefix, "abe")
    names = pair_scorer_names()
    if name not in names:
        if name in METRICS:
            raise CapscoreError(f"scorer {name!r} needs references; a probe scores (image, text) pairs: "
                                f"use one of {', '.join(names)}")
        raise unknown_name("scorer", name, names)
    spec = get_metric(name)
    return MetricPairScorer(spec, resolve_prefix(spec, prefix))
